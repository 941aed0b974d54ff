"""fetch_artifact: get a verified manifest's artifact into the store from its sources, in the manifest's order.

The manifest's `sources` list is the publisher's preference: a CDN listed before `{"type": "mqtt"}` is tried
first, and the MQTT channel is the fallback (and the other way round). Every http source is tried, not just the
first. The MQTT and HTTP pullers share the staging file and bitmap, so a pull that stalls or fails on one
source continues on the next from where it stopped. Every pull runs under download deadlines
(agent.artifacts.deadline: bytes per interval per source, an overall one) and the caller's cancel `check`; a
source that misses its deadline is abandoned for the next. Plain `http://` sources are skipped unless
`allow_http` (the chunk hashes protect integrity, not availability: anyone on the path could stall them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.artifacts.deadline import DownloadLimits, DownloadWatch
from agent.artifacts.manifest import Manifest, Source
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError, ArtifactRefused, DiskFull

if TYPE_CHECKING:  # pragma: no cover
    from agent.artifacts.pull import ChunkLink
    from agent.artifacts.recipe import Layout


def ordered_sources(manifest: Manifest, order: Sequence[str] | None = None) -> list[Source]:
    """The sources to try: the manifest's order; `order` (kinds, e.g. ("http",)) filters and re-ranks by kind."""
    sources = list(manifest.sources)
    if order is None:
        return sources
    rank = {kind: n for n, kind in enumerate(order)}
    return sorted((s for s in sources if s.type in rank), key=lambda s: rank[s.type])  # stable within a kind


def fetch_artifact(
    manifest: Manifest,
    store: ContentStore,
    *,
    link: ChunkLink | None = None,
    progress: Callable[..., None] | None = None,
    order: Sequence[str] | None = None,
    stall_timeout: float = 30.0,
    window: int | None = None,
    reserve_bytes: int = 0,
    ca: str | None = None,
    limits: DownloadLimits | None = None,
    check: Callable[[], None] | None = None,
    allow_http: bool = True,
    layout: Layout | None = None,
) -> Path:
    """Return the blob path; ArtifactError naming every source's failure when none delivered. `check` (the
    step's cancel/deadline) is called at least every 0.5 s while a source is pulled; what it raises ends the
    pull at once. layout: a recipe.Layout for a delta pull (agent.artifacts.delta), else the manifest's fixed
    chunks."""
    if store.has(manifest.artifact.sha256):
        return store.path(manifest.artifact.sha256)
    errors: list[str] = []
    permanent = True  # the whole pull failed for good only when every source did
    watch = (limits or DownloadLimits()).watch(f"{manifest.name} {manifest.version}", check)
    for src in ordered_sources(manifest, order):
        if src.type == "mqtt" and link is None:
            errors.append("mqtt: no broker connection configured")
            continue
        if src.type == "http" and not allow_http and (src.url or "").lower().startswith("http:"):
            errors.append(f"{src.url}: plain http refused (set downloads.allow_http: true to allow it)")
            continue
        if progress is not None:
            progress("source", model=manifest.name, version=manifest.version, source=src.url or src.type)
        watch.source(src.url or src.type)
        try:
            return _pull(src, manifest, store, link, progress, stall_timeout, window, reserve_bytes, ca, watch, layout)
        except ArtifactError as exc:
            if isinstance(exc, DiskFull):  # no other source can help
                raise
            permanent = permanent and exc.permanent
            errors.append(f"{src.url or src.type}: {exc}" if src.url else f"{src.type}: {exc}")
            if progress is not None:  # a source abandoned (a tarpit too slow for the deadline) says why, even
                progress(  # when the next source then delivers
                    "source_failed",
                    model=manifest.name,
                    version=manifest.version,
                    source=src.url or src.type,
                    reason=str(exc),
                )
    if not errors:
        raise ArtifactRefused(f"{manifest.name} {manifest.version} names no usable source")
    raise (ArtifactRefused if permanent else ArtifactError)("; ".join(errors))


def _pull(
    src: Source,
    manifest: Manifest,
    store: ContentStore,
    link: ChunkLink | None,
    progress: Callable[..., None] | None,
    stall_timeout: float,
    window: int | None,
    reserve_bytes: int,
    ca: str | None,
    watch: DownloadWatch,
    layout: Layout | None = None,
) -> Path:
    if src.type == "mqtt":
        from agent.artifacts.pull import ChunkPuller

        assert link is not None  # fetch_artifact skips an mqtt source when there is no link

        return ChunkPuller(
            link, store, window=window, stall_timeout=stall_timeout, reserve_bytes=reserve_bytes, progress=progress
        ).pull(manifest, watch, layout)
    from agent.artifacts.http import HttpPuller

    return HttpPuller(store, stall_timeout=stall_timeout, ca=ca, reserve_bytes=reserve_bytes, progress=progress).pull(
        manifest, src.url, watch, layout
    )


def is_transient(exc: BaseException) -> bool:
    """Will trying the same pull again later plausibly work? Stalls, broker or server gone, connection refused,
    HTTP 5xx/404/408/429: yes. A hash mismatch, no disk space, no usable source, other HTTP 4xx: no."""
    from agent.errors import TransportError

    if isinstance(exc, TransportError):
        return True
    if isinstance(exc, ArtifactError):
        return not exc.permanent
    return isinstance(exc, OSError)
