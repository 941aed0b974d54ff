"""Did this device take version V? The one device-outcome check behind `fleet push --wait` and `fleet rollout`.

Versions compare numerically (dotted integers: "2" == "2.0"), falling back to string equality for anything that
does not parse. Only a report the control plane verified (`trust == "verified"`: signed by the device's key in
the registry) says anything: any other report is pending, whatever it claims. What runs wins: a committed V is success whatever older records say; otherwise the device's
latest deployment record (or a rejection of V before the lifecycle) for V in a bad terminal state is failure.
"""

from __future__ import annotations

from typing import Any

COMMITTED, PENDING = "committed", "pending"
UNJUDGED = "not judged"  # probation could not measure it (agent.trial.unjudged): committed flagged or rolled back
TRUSTED = "verified"  # the one trust state (agent.fleet.registry) whose reports count, as success or failure
BAD_STATES = ("failed", "rejected", "rolled_back")
# A device's retained status document as received: untrusted JSON, read field by field with isinstance checks.
StatusDoc = dict[str, Any]


def same_version(a: Any, b: Any) -> bool:
    """Numeric comparison of dotted versions; plain equality when either does not parse."""
    from agent.artifacts.manifest import compare_versions
    from agent.errors import ManifestError

    if a is None or b is None:
        return False
    try:
        return compare_versions(str(a), str(b)) == 0
    except ManifestError:
        return str(a) == str(b)


ON_PROBATION = "on probation"  # runs the version, not committed yet: probation has not passed


def model_phase(model: Any, now: float | None = None) -> tuple[str, str]:
    """The one reading of a status document's `models[NAME]` entry, for the CLI, the API's readers and the
    dashboard: ("committed", words) only once probation passed (state committed, or stale: committed under
    other runtime versions); ("on probation", "on probation, 42 s left") before; otherwise (state, words)."""
    import time

    if not isinstance(model, dict) or not model.get("version"):
        return PENDING, "runs no version"
    state = str(model.get("state") or COMMITTED)
    if state in (COMMITTED, "stale"):
        return COMMITTED, f"committed {model.get('version')} on {model.get('provider') or '?'}"
    if state == "probation":
        ends = model.get("probation_ends")
        if isinstance(ends, (int, float)):
            left = max(0.0, ends - (time.time() if now is None else now))
            return ON_PROBATION, f"on probation, {left:.0f} s left"
        return ON_PROBATION, "on probation"
    return state, f"{state} {model.get('version')}"


def untrusted(status: Any) -> str | None:
    """Why a device's report is not believed ("report unsigned: not counted"); None when it is (or is absent)."""
    if not isinstance(status, dict) or status.get("trust") == TRUSTED:
        return None
    return f"report {status.get('trust') or 'not verified'}: not counted"


def _unjudged(status: StatusDoc, name: str, version: str) -> str | None:
    """'not judged (...counts)' when the device's record of this version says probation could not judge it."""
    dep = (status.get("deployments") or {}).get(name)
    if not isinstance(dep, dict) or not same_version(dep.get("version"), version):
        return None
    pr = dep.get("probation")
    n = pr.get("not_judged") if isinstance(pr, dict) else None
    if not isinstance(n, dict):
        return None
    why = f" ({str(n['why'])[:200]})" if isinstance(n.get("why"), str) else ""
    return f"not judged: {n.get('measured')} of {n.get('needed')} runs measured, {n.get('contended')} contended{why}"


def device_outcome(status: Any, name: str, version: str, *, fresh: bool = True) -> tuple[str, str]:
    """(result, reason) for (name, version) from a device's status document: result is "committed", one of
    BAD_STATES, "not judged" (probation could not measure it: committed flagged, or rolled back by the target's
    serving.unjudged, which is not a failure of the version) or "pending". `fresh`: the deployment record is newer than the push (only then does a bad
    record count: an old failure of the same version says nothing about this push)."""
    if not isinstance(status, dict):
        return PENDING, "no status"
    if untrusted(status):
        return PENDING, str(untrusted(status))
    model = (status.get("models") or {}).get(name)
    if isinstance(model, dict) and same_version(model.get("version"), version):
        phase, words = model_phase(model)
        if phase == ON_PROBATION:
            return PENDING, words
        if model.get("state", COMMITTED) == COMMITTED:
            flagged = _unjudged(status, name, version)
            if flagged:
                return UNJUDGED, f"committed on {model.get('provider') or '?'}, {flagged}"
            return COMMITTED, f"committed on {model.get('provider') or '?'}"
    dep = (status.get("deployments") or {}).get(name)
    if fresh and isinstance(dep, dict) and same_version(dep.get("version"), version):
        result = dep.get("result") or dep.get("state")
        if result in BAD_STATES or dep.get("state") in BAD_STATES:
            state = str(dep.get("state") if dep.get("state") in BAD_STATES else result)
            flagged = _unjudged(status, name, version) if state == "rolled_back" else None
            if flagged:  # serving.unjudged: rollback: not the version's fault, an operator's word (rollout_hold)
                return UNJUDGED, f"rolled back to the version judged before, {flagged}"
            return state, str(dep.get("reason") or state)
        return PENDING, f"state {dep.get('state')}"
    rejected = (status.get("rejected") or {}).get(name)
    if fresh and isinstance(rejected, dict) and same_version(rejected.get("version"), version):
        return "rejected", str(rejected.get("reason") or "rejected")
    return PENDING, "online, not started" if status.get("online") else "offline"
