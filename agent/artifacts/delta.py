"""Delta pulls: land an artifact whose manifest carries a chunk recipe, fetching only the chunks no held version has.

1. prefill: every chunk of the new version found in a blob the device holds (any version, any model: the
   RecipeBook index, keyed by chunk sha256) is copied into the staging file, checked against its hash on the
   way, and recorded in the staging bitmap (persisted before the network is touched);
2. the rest comes from the manifest's sources by recipe index (MQTT: chunk_size 0 requests; HTTP: one Range
   request per run of missing chunks), through the same resumable staging file and bitmap as a full pull, so a
   kill -9 at any point re-fetches no verified chunk;
3. the whole file's sha256 is checked as for every pull, and the recipe is kept for the next version.

A manifest without a recipe, or a device that holds none of its chunks, takes the full pull of today
(fixed-size chunks). The figures a deployment reports: `bytes_reused` (copied from held versions) and
`bytes_fetched` (the rest: moved over the network, before and after any restart).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.artifacts.fetch import fetch_artifact
from agent.artifacts.manifest import Manifest
from agent.artifacts.recipe import CHUNKERS, Layout, RecipeBook
from agent.artifacts.staging import Staging
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError, ArtifactRefused, DiskFull
from agent.util.atomic import atomic_write_json, read_json


def _reuse_path(store: ContentStore, sha256: str) -> Path:
    return store.staging / f"{sha256}.reused"


def prefill(store: ContentStore, layout: Layout, chunker: str) -> int:
    """Copy the chunks held in other blobs into the staging file; returns the bytes reused by this pull so far
    (this call and any earlier one that a restart interrupted)."""
    index = RecipeBook(store).index(chunker, skip=layout.sha256)
    mark = _reuse_path(store, layout.sha256)
    try:
        before = int((read_json(mark) or {}).get("bytes", 0)) if mark.exists() else 0
    except (OSError, ValueError, AttributeError):
        before = 0
    found = {i: index[c] for i, c in enumerate(layout.chunks) if c in index and index[c][2] == layout.lens[i]}
    if not found:  # nothing held to reuse: leave no staging file behind (the full pull starts fresh)
        return before
    added, fds = 0, {}
    staging = Staging(store, layout).open()
    try:
        for i in staging.missing():
            if i not in found:
                continue
            path, offset, length = found[i]
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
            if staging.write(i, os.pread(fds[path], length, offset)):
                added += length
        staging.persist()
    finally:
        for fd in fds.values():
            os.close(fd)
        staging.close()
    if added:
        atomic_write_json(mark, {"bytes": before + added})
    return before + added


def fetch_delta(
    manifest: Manifest, store: ContentStore, *, progress: Callable[..., None] | None = None, **kw: Any
) -> tuple[Path, dict[str, int]]:
    """Land the manifest's artifact (fetch_artifact's keywords); returns (blob path, {bytes_fetched, bytes_reused})."""
    a = manifest.artifact
    if store.has(a.sha256):
        return store.path(a.sha256), {"bytes_fetched": 0, "bytes_reused": a.size}
    if a.recipe is None or a.recipe.get("chunker") not in CHUNKERS:
        path = fetch_artifact(manifest, store, progress=progress, **kw)
        return path, {"bytes_fetched": a.size, "bytes_reused": 0}
    layout = Layout.from_recipe(a.sha256, a.size, dict(a.recipe))
    reused = prefill(store, layout, a.recipe["chunker"])
    if progress is not None:
        progress("reuse", model=manifest.name, version=manifest.version, reused=reused, total=a.size)
    if reused == 0:  # nothing to reuse: the full pull (fixed chunks: the fastest path)
        path = fetch_artifact(manifest, store, progress=progress, **kw)
    else:
        try:
            path = fetch_artifact(manifest, store, progress=progress, layout=layout, **kw)
        except (ArtifactRefused, DiskFull):
            raise
        except ArtifactError:  # e.g. an artifact server without recipes: fixed chunks, the .part is kept
            path = fetch_artifact(manifest, store, progress=progress, **kw)
    RecipeBook(store).put(a.sha256, {"chunker": a.recipe["chunker"], "chunks": [list(c) for c in a.recipe["chunks"]]})
    _reuse_path(store, a.sha256).unlink(missing_ok=True)
    return path, {"bytes_fetched": a.size - reused, "bytes_reused": reused}
