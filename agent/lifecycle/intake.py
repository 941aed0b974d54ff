"""Intake: the lifecycle's side of the Deployments port (agent.lifecycle.ports), what a source may ask of it.

A source reports what it verified (submit), asks what it has seen and what is in flight, and reports a desired
state that already serves (settle); whether that calls off a deployment in flight is decided here, not by the
source.
"""

from __future__ import annotations

from typing import Any, Protocol

from agent.lifecycle.journal import Deployment


class Lifecycle(Protocol):
    """What Intake drives (agent.lifecycle.orchestrator.Orchestrator)."""

    def submit(self, model: str, version: str, source: dict[str, Any], **data: Any) -> Deployment | None: ...

    def seen(self, model: str, digest: str) -> bool: ...

    def in_flight(self) -> dict[str, Deployment]: ...

    def cancel(self, target: str, reason: str = ...) -> Deployment | None: ...


class Intake:
    """Deployments (agent.lifecycle.ports) over the orchestrator."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    def submit(self, model: str, version: str, source: dict[str, Any], **data: Any) -> Deployment | None:
        return self.lifecycle.submit(model, version, source, **data)

    def seen(self, model: str, digest: str) -> bool:
        return self.lifecycle.seen(model, digest)

    def in_flight(self) -> dict[str, Deployment]:
        return self.lifecycle.in_flight()

    def settle(self, model: str, version: str) -> bool:
        """The desired state is `version`, which serves already: a deployment of another version still in flight
        (queued, qualifying, in its shadow phase or on probation) is cancelled, so the device ends on the version
        it was told to run. True when one was called off (its end may come too late: then the source resolves
        the model again once it has ended)."""
        dep = self.lifecycle.in_flight().get(model)
        if dep is None or dep.version == version:
            return False
        self.lifecycle.cancel(dep.id, f"desired state is {version} again, which serves already")
        return True
