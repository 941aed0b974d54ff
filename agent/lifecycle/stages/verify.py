"""VERIFYING: hash and package checks of the fetched artifact, unpacked under packages/."""

from __future__ import annotations

from agent.lifecycle import actions as act
from agent.lifecycle import integrity
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Verified
from agent.lifecycle.states import Event


def on_verifying(parts: Parts, dep: Deployment, ctx: act.StepContext) -> tuple[Event, Verified]:
    got = act.verify(parts.store, dep.data["sha256"], parts.packages, ctx, memory_max=parts.config.memory_max)
    integrity.record(got["package_dir"])  # what start-up checks the unpacked files against
    return Event.VERIFIED, Verified(got)
