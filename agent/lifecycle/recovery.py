"""RESUME: where each journaled state continues after a restart, and the start-up recovery pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.lifecycle.journal import Deployment, Journal
from agent.lifecycle.slots import ModelSlots
from agent.lifecycle.states import Event, State

# state found in the journal at start-up -> (event applied, what happens next)
RESUME: dict[State, tuple[Event, str]] = {
    State.RECEIVED: (Event.RESUME, "re-examine the manifest or inbox package"),
    State.DOWNLOADING: (Event.RESUME, "continue the download from its persisted chunk bitmap"),
    State.VERIFYING: (Event.RESUME, "verify the stored artifact again"),
    State.QUALIFYING: (Event.RESUME, "restart qualification (its child process died with the daemon)"),
    State.ACTIVATING: (Event.INTERRUPTED, "serve the committed slot: the interrupted activation is rolled back"),
    State.PROBATION: (
        Event.INTERRUPTED,
        "serve the committed slot: a crash during probation counts against the new model",
    ),
}
MAX_ATTEMPTS = 3  # entries into one state before recovery gives up (breaks crash loops)
# deployment -> a progress mark of its download (chunks on disk): a download that advanced since the last resume
# is no crash loop, whatever killed it
Progress = Callable[[Deployment], int]


@dataclass(frozen=True)
class Step:
    deployment: Deployment
    event: Event
    reason: str | None
    data: dict[str, Any] = field(default_factory=dict)
    fresh_attempts: bool = False  # progress since the last resume: the crash-loop count starts again


def commit_landed(slots: ModelSlots, dep: Deployment) -> bool:
    """Does the committed slot already hold this activating/probation deployment (its commit, or its local
    rollback's swap, landed before the journal said so)? Then its outcome is committed, whatever stopped it
    afterwards: the slot is what serves after any restart."""
    if dep.state not in (State.ACTIVATING, State.PROBATION):
        return False
    committed = slots.committed(dep.model)
    if committed is None or committed.sha256 != dep.data.get("sha256"):
        return False
    return committed.deployment_id == dep.id or dep.source.get("kind") == "rollback"


def plan(journal: Journal, slots: ModelSlots, progress: Progress | None = None) -> list[Step]:
    """Decide, without side effects, what recovery does with every in-flight deployment."""
    steps: list[Step] = []
    newest: dict[str, Deployment] = {}
    for dep in journal.in_flight():
        older = newest.get(dep.model)
        if older is not None:
            steps.append(_superseded(older, dep))
        newest[dep.model] = dep
    for dep in newest.values():
        steps.append(_step(dep, slots, progress))
    return steps


def _superseded(old: Deployment, new: Deployment) -> Step:
    event = Event.INTERRUPTED if old.state in (State.ACTIVATING, State.PROBATION) else Event.SUPERSEDE
    return Step(old, event, f"superseded by version {new.version} ({new.id})")


def _step(dep: Deployment, slots: ModelSlots, progress: Progress | None = None) -> Step:
    event, what = RESUME[dep.state]
    if event is Event.INTERRUPTED:
        if commit_landed(slots, dep):
            return Step(dep, Event.FOUND_COMMITTED, None)
        return Step(dep, event, f"daemon restarted during {dep.state.value}; {what}")
    tries = dep.attempts.get(dep.state.value, 0)
    if dep.state is State.DOWNLOADING and progress is not None:
        mark = progress(dep)
        if mark > int(dep.data.get("resume_mark") or 0):
            return Step(dep, event, None, {"resume_mark": mark}, fresh_attempts=True)
    if tries >= MAX_ATTEMPTS:
        return Step(dep, Event.FAIL, f"interrupted {tries} times in {dep.state.value}; giving up (crash loop)")
    return Step(dep, event, None)


def recover(journal: Journal, slots: ModelSlots, progress: Progress | None = None) -> list[Deployment]:
    """Apply the plan to the journal; return the deployments that must continue (non-terminal)."""
    journal.clean_temp()
    resumed = []
    for step in plan(journal, slots, progress):
        if step.fresh_attempts:
            step.deployment.attempts[step.deployment.state.value] = 0
        try:
            journal.apply(step.deployment, step.event, reason=step.reason, **step.data)
        except OSError:
            continue  # a full disk: it stays journaled as it was; the next start resumes it
        if not step.deployment.terminal:
            resumed.append(step.deployment)
    return resumed


def markdown() -> str:
    """RESUME as docs/daemon.md shows it (tests/test_daemon_doc.py keeps the page equal to this)."""
    rows = ["| journaled state at start-up | event applied | what happens |", "|---|---|---|"]
    rows += [f"| `{s.value}` | `{e.value}` | {what} |" for s, (e, what) in RESUME.items()]
    return "\n".join(rows) + "\n"
