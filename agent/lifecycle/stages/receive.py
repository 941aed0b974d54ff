"""RECEIVED and DOWNLOADING: the deployment's source checks it, then lands its artifact in the store."""

from __future__ import annotations

from agent.errors import LifecycleError
from agent.lifecycle.context import Rejected, StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.ports import missing_source
from agent.lifecycle.record import Fetched, Record
from agent.lifecycle.states import Event


def on_received(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, None]:
    kind = dep.source.get("kind")
    if kind == "rollback":
        return Event.ROLLBACK, None
    if kind == "requalify":  # the committed artifact measured again after a runtime change (drift)
        if not parts.store.has(Record(dep).sha256 or ""):
            raise LifecycleError("the committed artifact is no longer in the store: cannot re-qualify")
        return Event.ACCEPT, None
    source = parts.sources.get(kind) if isinstance(kind, str) else None
    if source is None:
        raise Rejected(missing_source(kind))
    source.check(dep)
    return Event.ACCEPT, None


def on_downloading(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Fetched]:
    rec = Record(dep)
    sha = rec.sha256
    if sha and parts.store.has(sha) and rec.fetched:
        return Event.FETCHED, Fetched()
    source = parts.sources.get(dep.source.get("kind", ""))
    if source is None:
        raise LifecycleError(f"no source {dep.source.get('kind')!r} configured to fetch from")
    return Event.FETCHED, source.fetch(dep, ctx)


def download_mark(parts: Parts, dep: Deployment) -> int:
    """Chunks of this deployment's artifact on disk (persisted bitmap): recovery's progress mark."""
    from agent.artifacts.staging import persisted_chunks

    sha = Record(dep).artifact_sha256
    return persisted_chunks(parts.store, sha) if sha else 0
