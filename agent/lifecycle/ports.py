"""The ports between the lifecycle and the sources (implementations: agent.sources).

DeploymentSource: the port through which desired state enters the lifecycle. A source verifies what it hands to
Deployments.submit (an MQTT manifest completely: sources.mqtt), says whether it is up (in-flight deployments that
need it resume only then), re-checks a deployment received before a restart, and fetches its artifact into the
content store. Deployments: what a source may ask of the lifecycle (lifecycle.intake). SourceEvents: what a
source tells the daemon (the DeviceAgent) about itself.
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


class Deployments(Protocol):
    """The lifecycle as a source sees it (agent.lifecycle.intake.Intake over the Orchestrator)."""

    def submit(self, model: str, version: str, source: dict[str, Any], **data: Any) -> Deployment | None:
        """Journal and queue verified desired state; None for a duplicate of one seen already."""

    def seen(self, model: str, digest: str) -> bool:
        """Was this exact desired state deployed already (and not failed retryably)?"""

    def in_flight(self) -> dict[str, Deployment]:
        """Running deployments per model, and resumed ones waiting for their source."""

    def settle(self, model: str, version: str) -> bool:
        """The desired state is `version`, which serves already: the lifecycle decides whether a deployment in
        flight is called off (True when one was)."""


class SourceEvents(Protocol):
    """What a source reports to the daemon (agent.app.DeviceAgent): nothing here decides a deployment."""

    def connection(self, connected: bool, reason: str) -> None:
        """The source's link came up or went down."""

    def rejected(self, record: dict[str, Any]) -> None:
        """A desired state was refused before the lifecycle saw it (the source publishes its event itself)."""


def missing_source(kind: Any) -> str:
    """The rejection reason of a deployment whose source.kind has no source here."""
    reason = UNCONFIGURED.get(kind) if isinstance(kind, str) else None
    return reason or f"unknown deployment source {kind!r}"
