"""Steps: dispatch of each lifecycle state to its stage (agent.lifecycle.stages) for one device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle import cleanup, restore
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts, Qualifier, StepConfig
from agent.lifecycle.ports import NEEDS_SOURCE
from agent.lifecycle.record import Result
from agent.lifecycle.slots import SlotEntry
from agent.lifecycle.stages import activate, probation, qualify, receive, verify
from agent.lifecycle.states import Event, State
from agent.lifecycle.table import ENTRY_ACTIONS, RESTORE

__all__ = ["Qualifier", "StepConfig", "Steps"]

Stage = Callable[[Parts, Deployment, StepContext], tuple[Event, Result]]

STAGES: dict[State, Stage] = {
    State.RECEIVED: receive.on_received,
    State.DOWNLOADING: receive.on_downloading,
    State.VERIFYING: verify.on_verifying,
    State.QUALIFYING: qualify.on_qualifying,
    State.ACTIVATING: activate.on_activating,
    State.PROBATION: probation.on_probation,
}


class Steps(Parts):
    """Runs one state's stage and names the event it ends with; the restore action of failed/rolled back."""

    def source_ready(self, dep: Deployment) -> bool:
        """May this deployment's next action run now? Only a state that talks to the source waits for it; a
        kind without a source runs (and is refused with the reason)."""
        src = self.sources.get(dep.source.get("kind", ""))
        return dep.state.value not in NEEDS_SOURCE or src is None or bool(src.ready())

    def download_mark(self, dep: Deployment) -> int:
        """Chunks of this deployment's artifact on disk (persisted bitmap): recovery's progress mark."""
        return receive.download_mark(self, dep)

    # ---- dispatch ------------------------------------------------------------------------------
    def run(self, dep: Deployment, ctx: StepContext) -> tuple[Event, dict[str, Any]]:
        stage = STAGES.get(dep.state)
        if stage is None:
            raise LifecycleError(f"no action for state {dep.state.value}")
        event, result = stage(self, dep, ctx)
        return event, ({} if result is None else result.to_data())

    def drifted(self) -> list[tuple[str, SlotEntry, str]]:
        """Start-up: committed models decided under other runtime versions (see stages.qualify.drifted)."""
        return qualify.drifted(self)

    def landed(self, dep: Deployment) -> None:
        """The FETCHED transition is journaled: the deployment's source may let go of its own copy."""
        src = self.sources.get(dep.source.get("kind", ""))
        if src is not None:
            src.landed(dep)

    def finished(self, dep: Deployment) -> None:
        cleanup.finished(self, dep)

    # ---- the restore action (entry of failed and rolled_back) ----------------------------------
    def restore_all(self) -> None:
        restore.restore_all(self)

    def ensure_committed(self, name: str) -> None:
        restore.ensure_committed(self, name)

    def enter(self, state: State, model: str) -> None:
        """Run the entry action the table names for `state` (table.ENTRY_ACTIONS), if any."""
        action = ENTRY_ACTIONS.get(state)
        if action == RESTORE:
            self.ensure_committed(model)
