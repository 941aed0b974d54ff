"""Persisted rollout state (atomic JSON under STORE/rollouts/) and how devices' retained status maps to results."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.fleet.outcome import BAD_STATES, COMMITTED, UNJUDGED, StatusDoc, device_outcome, same_version
from agent.fleet.rollout_plan import Planned, RolloutSpec
from agent.util.atomic import atomic_write_json, read_json

FORMAT = 1
# Per-device results. Terminal for the forward path: succeeded, failed. After a halt: rolled_back, cancelled,
# rollback_failed, not_reached.
PENDING, IN_PROGRESS, SUCCEEDED, FAILED = "pending", "in_progress", "succeeded", "failed"
NOT_JUDGED = "not_judged"  # took the version, but its probation could not measure it: counted apart
TOOK = (SUCCEEDED, NOT_JUDGED)
ROLLBACK_PENDING, ROLLED_BACK, ROLLBACK_FAILED = "rollback_pending", "rolled_back", "rollback_failed"
CANCELLED, NOT_REACHED = "cancelled", "not_reached"
# Cohort and rollout states.
RUNNING, ROLLING_BACK, COMPLETED, HALTED, PARTIAL = "running", "rolling_back", "completed", "halted", "partial"
ROLLOUT_FINAL = {COMPLETED, HALTED, PARTIAL}

# The persisted rollout (STORE/rollouts/<id>.json, and the control plane's rollout rows): a JSON document that the
# engine, the recall and agent.controlplane's runner edit in place; new_state() lists the keys it starts with.
RolloutState = dict[str, Any]
# One device's row in it (state["devices"][id]): the plan's fields (cohort, wave, previous_version, ...) plus
# result, reason, published and finished.
DeviceRow = dict[str, Any]


def rollouts_dir(store: str | Path) -> Path:
    return Path(store) / "rollouts"


def state_path(store: str | Path, rid: str) -> Path:
    return rollouts_dir(store) / f"{rid}.json"


def new_state(rid: str, spec: RolloutSpec, planned: Planned, manifest_info: dict[str, Any], now: float) -> RolloutState:
    cohorts: dict[str, dict[str, Any]] = {
        key: {
            "state": RUNNING,
            "wave": 0,
            "waves": c["waves"],
            "canary": c["canary"],
            "wave_started": {},
            "reason": None,
            "rollback_started": None,
        }
        for key, c in planned["cohorts"].items()
    }
    devices: dict[str, DeviceRow] = {
        dev: {**d, "result": PENDING, "reason": None, "published": None, "finished": None}
        for dev, d in planned["devices"].items()
    }
    return {
        "format": FORMAT,
        "rollout_id": rid,
        "spec": spec.to_dict(),
        "state": RUNNING,
        "created": now,
        "updated": now,
        "artifact": manifest_info,
        "cohorts": cohorts,
        "devices": devices,
    }


def load_state(store: str | Path, rid: str) -> RolloutState | None:
    doc = read_json(state_path(store, rid))
    if doc is None:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("rollout_id") != rid:
        raise ConfigError(f"{state_path(store, rid)}: not a rollout state file this version understands")
    return doc


def save_state(store: str | Path, state: RolloutState) -> None:
    state["updated"] = time.time()
    atomic_write_json(state_path(store, state["rollout_id"]), state)


def list_states(store: str | Path) -> list[RolloutState]:
    out = []
    for p in sorted(rollouts_dir(store).glob("*.json")):
        doc = read_json(p)
        if isinstance(doc, dict) and doc.get("format") == FORMAT:
            out.append(doc)
    return out


def observe(doc: StatusDoc | None, name: str, version: str) -> tuple[str | None, str | None]:
    """What a device's retained status says about (name, version): (SUCCEEDED|FAILED|None, reason)."""
    result, reason = device_outcome(doc, name, version)
    if result == COMMITTED:
        return SUCCEEDED, reason
    if result == UNJUDGED:
        return NOT_JUDGED, reason
    if result in BAD_STATES:
        return FAILED, f"{result}: {reason}"
    return None, None


def holds(doc: StatusDoc | None, name: str, version: str | None) -> bool:
    """Does the device currently run (committed or on probation) this version of the model?"""
    model = ((doc or {}).get("models") or {}).get(name) if isinstance(doc, dict) else None
    return isinstance(model, dict) and same_version(model.get("version"), version)


def held_before(doc: StatusDoc | None, name: str, version: str | None) -> bool:
    """Did the device run this version before what it runs now (its status names it as the previous one)?"""
    model = ((doc or {}).get("models") or {}).get(name) if isinstance(doc, dict) else None
    return isinstance(model, dict) and same_version(model.get("previous"), version)


def wave_counts(state: RolloutState, key: str) -> list[dict[str, Any]]:
    """Per-wave counts of one cohort for the progress document and the summary."""
    cohort = state["cohorts"][key]
    rows = []
    for i, ids in enumerate(cohort["waves"]):
        counts: dict[str, int] = {}
        for dev in ids:
            r = state["devices"][dev]["result"]
            counts[r] = counts.get(r, 0) + 1
        kind = "canary" if i == 0 and cohort["canary"] else "wave"
        rows.append(
            {
                "index": i,
                "kind": kind,
                "size": len(ids),
                "started": cohort["wave_started"].get(str(i)),
                "counts": counts,
            }
        )
    return rows


def totals(state: RolloutState) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in state["devices"].values():
        out[d["result"]] = out.get(d["result"], 0) + 1
    return out


def progress_doc(state: RolloutState) -> dict[str, Any]:
    """The retained p/rollouts/{id} document: where every cohort and wave stands."""
    spec = state["spec"]
    return {
        "rollout_id": state["rollout_id"],
        "model": spec["name"],
        "version": spec["version"],
        "group": spec["group"],
        "cohort_by": spec["cohort_by"],
        "state": state["state"],
        "created": state["created"],
        "ts": time.time(),
        "devices": len(state["devices"]),
        "counts": totals(state),
        "rollback": state.get("rollback"),  # an operator's roll back (agent.fleet.rollout_recall), when asked
        "waiting_for_operator": held_devices(state),  # devices not judged, held for an operator's word (rollout_hold)
        "unjudged": state.get("unjudged"),  # the operator's last word on them: request, action, devices
        "cohorts": {
            key: {
                "state": c["state"],
                "wave": c["wave"],
                "waves_total": len(c["waves"]),
                "reason": c["reason"],
                "waiting": c.get("waiting") if c["state"] == RUNNING else None,  # held for an operator's word
                "waves": wave_counts(state, key),
            }
            for key, c in state["cohorts"].items()
        },
    }


def held_devices(state: RolloutState) -> list[str]:
    """Devices not judged, waiting for an operator's word (agent.fleet.rollout_hold)."""
    return sorted(dev for dev, d in state["devices"].items() if d["result"] == NOT_JUDGED and d.get("held"))


def summary(state: RolloutState) -> dict[str, Any]:
    """The summary JSON: the progress document plus every device with its result and reason."""
    doc, now = progress_doc(state), time.time()
    doc["devices"] = [
        {
            "device_id": dev,
            "cohort": d["cohort"],
            "wave": d["wave"],
            "result": d["result"],
            "reason": d["reason"],
            "previous_version": d["previous_version"],
            "waiting_for": waiting_for(state, d, now),
        }
        for dev, d in sorted(state["devices"].items())
    ]
    return doc


def waiting_for(state: RolloutState, d: DeviceRow, now: float) -> str | None:
    """What the rollout waits for from this device, in words (None: nothing, its result is final)."""
    spec, cohort = state["spec"], state["cohorts"].get(d["cohort"]) or {}
    deadline = float(spec.get("deadline_s") or 0)
    result = d["result"]
    if result == PENDING:
        if cohort.get("state") != RUNNING:
            return None
        return f"wave {d['wave']} of cohort {d['cohort']} to start (now wave {cohort.get('wave')})"
    if result == IN_PROGRESS:
        if d.get("queued"):
            return "the rate limit to release its desired state"
        started = (cohort.get("wave_started") or {}).get(str(d["wave"]))
        left = f" ({max(0.0, started + deadline - now):.0f} s left)" if started else ""
        return f"a verified report that it committed {spec['version']} after probation{left}"
    if result == NOT_JUDGED and d.get("held"):
        return "an operator's word: accept the version or roll this device back (its probation could not judge it)"
    if result == ROLLBACK_PENDING:
        started = d.get("asked") or cohort.get("rollback_started")
        left = f" ({max(0.0, started + deadline - now):.0f} s left)" if started else ""
        if d.get("previous_version"):
            return f"a verified report that it runs {d['previous_version']} again{left}"
        return f"a verified report that it dropped {spec['version']}{left}"
    if result == ROLLBACK_FAILED and d.get("took"):
        return "a repeated roll back: it may still run " + str(spec["version"])
    return None
