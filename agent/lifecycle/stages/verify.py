"""VERIFYING: hash and package checks of the fetched artifact, unpacked under packages/."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import LifecycleError, ModelError
from agent.lifecycle import integrity
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Verified
from agent.lifecycle.states import Event
from agent.package.unpack import unpack
from agent.util.hashing import sha256_file

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore

log = logging.getLogger(__name__)


def on_verifying(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Verified]:
    # the package check (checker + shape inference in a child) waits in the qualification queue: one native
    # child at a time, never beside a timed row; the state's deadline does not run while it waits
    with parts.qualify_queue.turn(f"check {dep.model} {dep.version} ({dep.id})", ctx) as turn:
        if ctx.deadline is not None:
            ctx.deadline += turn["queued_s"]
        got = verify(
            parts.store,
            dep.data["sha256"],
            parts.packages,
            ctx,
            memory_max=parts.config.memory_max,
            before_check=lambda package_dir: signature(parts, package_dir),
        )
    integrity.record(got["package_dir"])  # what start-up checks the unpacked files against
    return Event.VERIFIED, Verified(
        package_dir=got["package_dir"],
        model_path=got["model_path"],
        model_sha256=got["model_sha256"],
        model_signature=got.get("model_signature"),
    )


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


def verify(
    store: ContentStore,
    sha: str,
    packages_root: Path,
    ctx: StepContext,
    *,
    memory_max: int | None = None,
    before_check: Callable[[Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Re-hash the stored blob, unpack it (both streamed: a chunk at a time) and run the package checks
    (ONNX checker + shape inference) in a child process: the checker holds the whole model in memory, the
    daemon never does. before_check(root) -> dict: runs on the unpacked files before any of them is parsed
    (the model signature); what it returns is added to the result."""
    if not store.has(sha):
        raise LifecycleError(f"artifact {sha[:12]} is not in the store")
    actual = sha256_file(store.path(sha))
    if actual != sha:
        raise LifecycleError(f"artifact hash mismatch: expected {sha[:12]}, store holds {actual[:12]}")
    ctx.check()
    root = unpack(store, sha, packages_root)
    first = before_check(root) if before_check is not None else {}
    from agent.isolate.runner import run_isolated

    left = ctx.remaining()
    res = run_isolated(
        "agent.package.unpack:check_package",
        {"root": str(root)},
        timeout=600.0 if left is None else left + 5.0,
        tag="verify",
        check=ctx.check,
        memory_max=memory_max,
    )
    if not res.ok:
        why = res.error.removeprefix("ModelError: ")
        raise ModelError(why if res.kind == "exception" else f"package check: {why}")
    got: dict[str, Any] = {**res.value, **first}
    return got
