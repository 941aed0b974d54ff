"""DeploymentSource: the port through which desired state enters the lifecycle (implementations: agent.sources).

A source verifies what it hands to Orchestrator.submit (an MQTT manifest completely: sources.mqtt), says
whether it is up (in-flight deployments that need it resume only then), re-checks a deployment received
before a restart, and fetches its artifact into the content store.
"""

from __future__ import annotations

from typing import Any, Protocol

from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.record import Fetched

NEEDS_SOURCE = ("received", "downloading")  # states whose action talks to the source
# why a deployment of a known kind finds no source on this daemon (the kind's source is not configured here)
UNCONFIGURED = {"manifest": "this daemon has no MQTT link: manifests are not accepted"}


class DeploymentSource(Protocol):
    kind: str  # the deployment's source.kind this source owns

    def ready(self) -> bool:
        """Can check()/fetch() work now (link up)?"""

    def check(self, dep: Deployment) -> None:
        """RECEIVED (again, after a restart): raise Rejected when the deployment may not go on."""

    def fetch(self, dep: Deployment, ctx: StepContext) -> Fetched:
        """DOWNLOADING: land the artifact in the store and say what landed; the lifecycle journals it (a source
        never writes the journal)."""

    def landed(self, dep: Deployment) -> None:
        """The fetch is journaled: the source may let go of its own copy (the inbox directory)."""


def missing_source(kind: Any) -> str:
    """The rejection reason of a deployment whose source.kind has no source here."""
    reason = UNCONFIGURED.get(kind) if isinstance(kind, str) else None
    return reason or f"unknown deployment source {kind!r}"
