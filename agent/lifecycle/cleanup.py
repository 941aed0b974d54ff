"""After a deployment: consume its inbox copy, bound the journal, collect unreferenced blobs and decisions."""

from __future__ import annotations

import shutil

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.perms import harden
from agent.lifecycle.record import Record
from agent.lifecycle.slots import ModelSlots, SlotEntry, gc
from agent.lifecycle.states import State


def finished(parts: Parts, dep: Deployment) -> None:
    """A deployment ended: its inbox directory (if still there) is consumed so it is not picked up again;
    a failed re-qualification leaves the model serving, stale, with the reason; old terminal records beyond
    keep_deployments per model are compacted away (the journal stays bounded)."""
    if dep.source.get("kind") == "inbox" and dep.source.get("path"):
        shutil.rmtree(dep.source["path"], ignore_errors=True)
    if dep.source.get("kind") == "requalify" and dep.state is not State.COMMITTED and dep.model in parts.stale:
        parts.stale[dep.model] = (
            f"decided under other versions ({dep.source.get('drift')}); re-qualification "
            f"{dep.state.value}: {dep.reason}; still serving the old decision"
        )
    if dep.state in (State.COMMITTED, State.ROLLED_BACK) or (dep.state is State.FAILED and "selected" in dep.data):
        parts.attest(dep, "trial", dep.state.value, dep.reason)
    harden(parts.state_dir)
    try:
        keep = {e.deployment_id for e in _slot_entries(parts.slots)}
        parts.journal.prune(parts.config.keep_deployments, keep_ids={k for k in keep if k})
    except (OSError, LifecycleError):
        pass  # compacted at the next end


def collect_garbage(parts: Parts) -> None:
    keep = parts.slots.referenced()
    in_flight = parts.journal.in_flight()
    for dep in in_flight:
        rec = Record(dep)
        keep.update(v for v in (rec.sha256, rec.model_sha256, rec.artifact_sha256) if v)
    # ContentStore.gc also clears staging/: never while another model's deployment may be writing there
    fetching = any(d.state in (State.RECEIVED, State.DOWNLOADING) for d in in_flight)
    try:
        if not fetching:
            gc(parts.state_dir, parts.store, keep)
    except (OSError, EdgeAgentError):
        pass  # garbage stays until the next commit
    parts.journal.prune(
        parts.config.keep_deployments,
        keep_ids={e.deployment_id for e in _slot_entries(parts.slots) if e.deployment_id is not None},
    )
    ids = {d.id for d in parts.journal.all()}
    for p in (parts.state_dir / "decisions").glob("*.json"):
        if p.stem not in ids:
            p.unlink(missing_ok=True)


def _slot_entries(slots: ModelSlots) -> list[SlotEntry]:
    """Every committed/previous entry of the readable slot files."""
    out: list[SlotEntry] = []
    for name in slots.names():
        try:
            out += [e for e in slots.get(name).values() if e]
        except LifecycleError:
            continue
    return out
