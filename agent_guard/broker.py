"""The trial's broker check: the new release must connect to its MQTT broker. The agent says so in its status
document (state_dir/status.json, rewritten at each connect: `"broker": {"connected": true}`) under its own pid;
a device without an `mqtt` section (`"mode": "local"`, packages come through the inbox) has no broker, and the
check is not applicable. Standard library only."""

from __future__ import annotations

from pathlib import Path

from agent_guard.links import read_json

WAIT, CONNECTED, NOT_APPLICABLE = "wait", "connected", "not-applicable"


def state(state_dir: Path, pid: int | None) -> tuple[str, str]:
    """(WAIT | CONNECTED | NOT_APPLICABLE, what the agent with this pid reported, in words)."""
    doc = read_json(state_dir / "status.json") or {}
    if pid is None or doc.get("pid") != pid:
        return WAIT, "its status.json is not written yet"
    if doc.get("mode") == "local":
        return NOT_APPLICABLE, "not applicable: no broker configured (inbox mode)"
    link = doc.get("broker")
    if not isinstance(link, dict):  # a release from before the field: it cannot be checked, and is not failed for it
        return NOT_APPLICABLE, "not applicable: this release does not report its broker connection"
    if link.get("connected") is True:
        return CONNECTED, "connected"
    return WAIT, "not connected to its broker"
