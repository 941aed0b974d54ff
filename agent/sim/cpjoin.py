"""A simulated fleet on a running control plane (`fleet simulate --control-plane URL`): how far its devices'
enrollment got (each device's own view, agent.services.cpsync's snapshot), and the operator's accept through the
API (`--accept`: `POST /api/v1/devices/ID/accept` with an operator token, the simulator's groups), asked once per
device that says it is pending; the device sees it at its next round (agent.sim.simulator.CP_RETRY_MAX_S)."""

from __future__ import annotations

from typing import Any

STATES = ("accepted", "pending", "rejected")


def summary(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{accepted, pending, rejected, unanswered: counts; posted: decision records acknowledged in all; error: the
    first last error of a device that has no answer or was rejected (why), else None}."""
    out: dict[str, Any] = {s: 0 for s in (*STATES, "unanswered")}
    out["posted"], out["error"] = 0, None
    for dev, snap in sorted(states.items()):
        state = snap.get("enrollment")
        out[state if state in STATES else "unanswered"] += 1
        out["posted"] += int(snap.get("posted") or 0)
        if state not in ("accepted", "pending") and out["error"] is None and snap.get("last_error"):
            out["error"] = f"{dev}: {snap['last_error']}"
    return out


class Acceptor:
    """Accept, as an operator, the simulated devices that are pending at the control plane (each once)."""

    def __init__(self, url: str, token: str, groups: list[str]):
        self.url, self.token, self.groups = url, token, list(groups)
        self.accepted: set[str] = set()
        self.errors: dict[str, str] = {}  # device id -> why the service refused to accept it (not asked again)

    def tick(self, states: dict[str, dict[str, Any]]) -> list[str]:
        """Accept every device that is pending and was not accepted (or refused) yet: the ids accepted now."""
        from agent.errors import TransportError
        from agent.transport.cpclient import HttpError, call

        done = []
        for dev, snap in sorted(states.items()):
            if snap.get("enrollment") != "pending" or dev in self.accepted or dev in self.errors:
                continue
            try:
                call(self.url, "POST", f"/api/v1/devices/{dev}/accept", {"groups": self.groups}, self.token, 5.0)
            except HttpError as exc:
                if exc.code != 404:  # 404: the request is not stored yet (or was dropped): asked again next tick
                    self.errors[dev] = str(exc)
                continue
            except TransportError:
                continue  # the service is away: the next tick asks again
            self.accepted.add(dev)
            done.append(dev)
        return done
