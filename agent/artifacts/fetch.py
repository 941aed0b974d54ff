"""fetch_artifact: get a verified manifest's artifact into the store from its sources, in order, with fallback.

The MQTT and HTTP pullers share the staging file and bitmap, so a pull that stalls on one source continues
on the next from where it stopped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from agent.artifacts.manifest import Manifest
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError


def fetch_artifact(manifest: Manifest, store: ContentStore, *, link=None, progress: Callable[..., None] | None = None,
                   order=("mqtt", "http"), stall_timeout: float = 30.0, window: int | None = None, reserve_bytes: int = 0,
                   ca: str | None = None) -> Path:
    """Return the blob path; ArtifactError naming every source's failure when none delivered."""
    if store.has(manifest.artifact.sha256):
        return store.path(manifest.artifact.sha256)
    errors = []
    for kind in order:
        src = manifest.source(kind)
        if src is None:
            continue
        if kind == "mqtt" and link is None:
            errors.append("mqtt: no broker connection configured")
            continue
        try:
            if kind == "mqtt":
                from agent.artifacts.pull import ChunkPuller

                return ChunkPuller(link, store, window=window, stall_timeout=stall_timeout,
                                   reserve_bytes=reserve_bytes, progress=progress).pull(manifest)
            from agent.artifacts.http import HttpPuller

            return HttpPuller(store, stall_timeout=stall_timeout, ca=ca, reserve_bytes=reserve_bytes,
                              progress=progress).pull(manifest, src.url)
        except ArtifactError as exc:
            if "not enough disk" in str(exc):
                raise
            errors.append(f"{kind}: {exc}")
    raise ArtifactError("; ".join(errors) or f"{manifest.name} {manifest.version} names no usable source")
