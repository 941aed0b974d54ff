"""TRANSITIONS: every legal (state, event) -> state of a deployment, on one screen."""

from __future__ import annotations

from agent.errors import LifecycleError
from agent.lifecycle.states import Event as E
from agent.lifecycle.states import State as S

_ABORT_BEFORE_SWAP = {E.FAIL: S.FAILED, E.TIMEOUT: S.FAILED, E.CANCEL: S.FAILED, E.SUPERSEDE: S.FAILED}
_ABORT_AFTER_SWAP = {
    E.FAIL: S.ROLLED_BACK,
    E.TIMEOUT: S.ROLLED_BACK,
    E.CANCEL: S.ROLLED_BACK,
    E.SUPERSEDE: S.ROLLED_BACK,
    E.INTERRUPTED: S.ROLLED_BACK,
    E.FOUND_COMMITTED: S.COMMITTED,
}

TRANSITIONS: dict[tuple[S, E], S] = {
    # happy path
    (S.RECEIVED, E.ACCEPT): S.DOWNLOADING,
    (S.DOWNLOADING, E.FETCHED): S.VERIFYING,
    (S.VERIFYING, E.VERIFIED): S.QUALIFYING,
    (S.QUALIFYING, E.QUALIFIED): S.ACTIVATING,
    (S.ACTIVATING, E.ACTIVATED): S.PROBATION,
    (S.PROBATION, E.PASSED): S.COMMITTED,
    # refusals and local rollback
    (S.RECEIVED, E.REJECT): S.REJECTED,
    (S.RECEIVED, E.ROLLBACK): S.ACTIVATING,
    (S.ACTIVATING, E.SWAPPED): S.COMMITTED,
    # probation trouble
    (S.PROBATION, E.TROUBLE): S.ROLLED_BACK,
    # recovery after a restart (see recovery.RESUME)
    (S.RECEIVED, E.RESUME): S.RECEIVED,
    (S.DOWNLOADING, E.RESUME): S.DOWNLOADING,
    (S.VERIFYING, E.RESUME): S.VERIFYING,
    (S.QUALIFYING, E.RESUME): S.QUALIFYING,
    (S.ACTIVATING, E.INTERRUPTED): S.ROLLED_BACK,
    (S.ACTIVATING, E.FOUND_COMMITTED): S.COMMITTED,
    # aborts: nothing swapped yet -> failed; new model possibly serving -> rolled back to committed
    **{
        (s, e): t for s in (S.RECEIVED, S.DOWNLOADING, S.VERIFYING, S.QUALIFYING) for e, t in _ABORT_BEFORE_SWAP.items()
    },
    **{(S.ACTIVATING, e): S.FAILED for e in (E.FAIL, E.TIMEOUT, E.CANCEL, E.SUPERSEDE)},
    **{(S.PROBATION, e): t for e, t in _ABORT_AFTER_SWAP.items()},
}

# Entry actions: what entering a state does before the transition is journaled (agent.lifecycle.restore). A
# crash in between: recovery finds activating/probation and rolls back the same way.
RESTORE = "restore"  # the committed slot serves again (lifecycle.restore.ensure_committed)
ENTRY_ACTIONS: dict[S, str] = {S.FAILED: RESTORE, S.ROLLED_BACK: RESTORE}


def next_state(state: S | str, event: E | str) -> S:
    """The state that `event` leads to from `state`; LifecycleError if the table has no such edge."""
    try:
        key = (S(state), E(event))
    except ValueError as exc:
        raise LifecycleError(f"unknown lifecycle state or event: {exc}") from None
    if key not in TRANSITIONS:
        raise LifecycleError(f"illegal transition: event '{key[1]}' in state '{key[0]}'")
    return TRANSITIONS[key]


def events_from(state: S | str) -> dict[E, S]:
    """Every event accepted in `state` and where it leads."""
    return {e: t for (s, e), t in TRANSITIONS.items() if s == S(state)}


def markdown() -> str:
    """The table as docs/daemon.md shows it, one row per state (tests/test_daemon_doc.py keeps the page equal)."""
    rows = ["| state | event(s) -> next state |", "|---|---|"]
    for state in S:
        by_target: dict[S, list[str]] = {}
        for event, target in events_from(state).items():
            by_target.setdefault(target, []).append(f"`{event.value}`")
        if by_target:
            cells = "; ".join(f"{', '.join(sorted(evs))} -> `{t.value}`" for t, evs in by_target.items())
            rows.append(f"| `{state.value}` | {cells} |")
    return "\n".join(rows) + "\n"
