"""VERIFYING: hash and package checks of the fetched artifact, unpacked under packages/."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agent.lifecycle import actions as act
from agent.lifecycle import integrity
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Verified
from agent.lifecycle.states import Event

log = logging.getLogger(__name__)


def on_verifying(parts: Parts, dep: Deployment, ctx: act.StepContext) -> tuple[Event, Verified]:
    # the package check (checker + shape inference in a child) waits in the qualification queue: one native
    # child at a time, never beside a timed row; the state's deadline does not run while it waits
    with parts.qualify_queue.turn(f"check {dep.model} {dep.version} ({dep.id})", ctx) as turn:
        if ctx.deadline is not None:
            ctx.deadline += turn["queued_s"]
        got = act.verify(
            parts.store,
            dep.data["sha256"],
            parts.packages,
            ctx,
            memory_max=parts.config.memory_max,
            before_check=lambda package_dir: signature(parts, package_dir),
        )
    integrity.record(got["package_dir"])  # what start-up checks the unpacked files against
    return Event.VERIFIED, Verified(got)


def signature(parts: Parts, package_dir: Path) -> dict[str, Any]:
    """The package's OpenSSF model signature, when this device requires one (agent.artifacts.modelsig)."""
    trust = parts.config.model_trust
    if trust is None or not trust.enabled:
        return {}
    from agent.artifacts.modelsig import verify_package

    got = verify_package(package_dir, trust)
    if got["ignored"]:  # the journal keeps the list (model_signature.ignored); the log says it as it happens
        log.warning("model signature: unsigned files left in by trust.model_signing_ignore_paths: %s", got["ignored"])
    return {"model_signature": got}
