""" "Not judged": a verdict that could not be measured is its own outcome, never a pass that guessed.

Probation (and shadow) cannot judge compute time when the device never gave the candidate's runs the cores
(rungate.py drops a run whose threads waited), nor when requests came but their runs were too few for any other
reason or there was nothing to compare them with (no baseline): every such skip is "not judged" (`why` names
it). The verdict then says "not judged" with the counts, and the target decides (`serving.unjudged`):
`rollback` (the default, issue 36: the device returns to the version it served before, which was judged) or
`commit-flagged` (the version serves, its status and decision record say "not judged"). A first deployment has no
earlier version to return to: it commits flagged whatever the policy, and says why. Retrying first is
`serving.probation.extend`: probation watches on, up to that many windows, before it says "not judged".
"""

from __future__ import annotations

from typing import Any

NOT_JUDGED = "not judged"
POLICIES = ("rollback", "commit-flagged")
DEFAULT_POLICY = "rollback"


def compute_counts(f: dict[str, Any], need: int) -> dict[str, Any]:
    """The counts behind a "not judged" compute verdict: measured, dropped as contended, needed."""
    return {
        "signal": "compute",
        "measured": f.get("compute_samples", 0),
        "contended": f.get("compute_contended", 0),
        "needed": need,
        "requests": f.get("requests", 0),
        "incumbent_contended": f.get("baseline", {}).get("contended", 0),
    }


def compute_unjudged(f: dict[str, Any], need: int) -> bool:
    """No compute quantile judged because runs were dropped as contended: the candidate's (too few measured
    against a baseline), or the incumbent's (its runs before the swap were served but too few measured, so there
    is no baseline). Not: no requests, or no baseline on a first deployment without qualified figures."""
    if f.get("compute"):
        return False
    base = f.get("baseline", {})
    if base.get("source") is None:
        return bool(base.get("contended"))
    return bool(f.get("compute_samples", 0) < need and f.get("compute_contended", 0) > 0)


def runs_unjudged(f: dict[str, Any]) -> bool:
    """Requests came but no compute quantile was judged, for any reason besides contention (too few runs
    measured, the baseline's figures too few, no baseline at all): "not judged", never a pass. A quiet window
    (no request) is not this: serving.probation.min_requests decides it."""
    return not f.get("compute") and f.get("requests", 0) > 0


def skip_counts(f: dict[str, Any], need: int, why: str) -> dict[str, Any]:
    """compute_counts plus why the runs that came were not judged (`why`, the probation's words)."""
    return {**compute_counts(f, need), "why": why}


def reason(prefix: str, counts: dict[str, Any]) -> str:
    if counts.get("why"):
        return f"{prefix}: compute time not judged: {counts['why']} ({counts['requests']} requests)"
    said = (
        f"{prefix}: compute time not judged: {counts['measured']} runs measured of the {counts['needed']} needed, "
        f"{counts['contended']} dropped because their threads waited for the cores ({counts['requests']} requests)"
    )
    if counts.get("incumbent_contended"):
        said += f"; no baseline: {counts['incumbent_contended']} of the incumbent's runs before the swap were dropped"
    return said


def policy_of(serving: dict[str, Any] | None) -> str:
    value = str((serving or {}).get("unjudged", DEFAULT_POLICY))
    return value if value in POLICIES else DEFAULT_POLICY


def decide(state: str, why: str, serving: dict[str, Any] | None, trouble: str, earlier: bool = True) -> tuple[str, str]:
    """A NOT_JUDGED verdict under the target's policy: (trouble, why + 'rolled back') or (NOT_JUDGED, why +
    'committed flagged'). `earlier`: the device has a committed version to return to (not on a first deployment,
    which commits flagged whatever the policy). Other states pass through."""
    if state != NOT_JUDGED:
        return state, why
    policy = policy_of(serving)
    if policy == "rollback" and earlier:
        return trouble, f"{why}; rolled back to the version judged before (the target's serving.unjudged is rollback)"
    if policy == "rollback":
        return NOT_JUDGED, f"{why}; committed flagged: a first deployment has no earlier version to roll back to"
    return NOT_JUDGED, f"{why}; committed flagged (the target's serving.unjudged is commit-flagged)"
