"""Renamed to agent.fleet.watch (FleetWatch, device_row, fleet_status). This alias stays only for the one import
left in agent/sim/simulator.py (another branch's room): point that import at agent.fleet.watch, then delete this."""

from __future__ import annotations

from agent.fleet.watch import TERMINAL_BAD, FleetWatch, device_row, fleet_status

__all__ = ["TERMINAL_BAD", "FleetWatch", "device_row", "fleet_status"]
