"""Lifecycle states and events of one deployment; persisted values equal their names."""

from __future__ import annotations

from enum import Enum


class State(str, Enum):
    RECEIVED = "received"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    QUALIFYING = "qualifying"
    ACTIVATING = "activating"
    PROBATION = "probation"
    COMMITTED = "committed"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    REJECTED = "rejected"

    def __str__(self) -> str:
        return self.value


class Event(str, Enum):
    ACCEPT = "accept"  # manifest / inbox package accepted
    REJECT = "reject"  # manifest refused before download
    ROLLBACK = "rollback"  # local rollback request: go straight to activation of the previous slot
    FETCHED = "fetched"  # artifact is in the content store
    VERIFIED = "verified"  # hash + package checks passed
    QUALIFIED = "qualified"  # a provider was selected
    ACTIVATED = "activated"  # new session swapped in (make-before-break)
    SWAPPED = "swapped"  # slot swap done without probation (local rollback)
    PASSED = "passed"  # probation passed
    TROUBLE = "trouble"  # probation found errors/NaN/latency
    FAIL = "fail"  # the state's action failed
    TIMEOUT = "timeout"  # the state's deadline passed
    CANCEL = "cancel"  # operator cancelled
    SUPERSEDE = "supersede"  # a newer deployment of the same model arrived
    RESUME = "resume"  # recovery: redo/continue this state after a restart
    INTERRUPTED = "interrupted"  # recovery: the process died during activation/probation
    FOUND_COMMITTED = "found_committed"  # recovery: the slot commit landed before the crash

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset({State.COMMITTED, State.FAILED, State.ROLLED_BACK, State.REJECTED})
# States in which the new model may already be serving (an abort must restore the committed slot).
SERVING_NEW = frozenset({State.ACTIVATING, State.PROBATION})
ORDER = (
    State.RECEIVED,
    State.DOWNLOADING,
    State.VERIFYING,
    State.QUALIFYING,
    State.ACTIVATING,
    State.PROBATION,
    State.COMMITTED,
)
