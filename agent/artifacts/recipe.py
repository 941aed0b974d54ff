"""Chunk recipes: an artifact cut into content-defined chunks, each addressed by its sha256.

A recipe is `{"chunker": CHUNKER, "chunks": [[sha256, length], ...]}` (offsets follow from the lengths). The cut
points are the start and end of every ONNX tensor's data (so a fine-tune that rewrites one tensor changes only
that tensor's chunks; inside a tensor, fixed 256 KiB pieces from its start) and FastCDC (Gear hash, normalised
chunking) everywhere else, so bytes that move (a graph edit, a renamed node, a non-ONNX file) still land in the
same chunks. bench/bench_delta.py measures this against each
method alone. A gzip stream is never chunked: one changed byte changes every compressed byte after it.

`Layout` is the puller's view of a recipe (same interface as manifest.Artifact, with variable offsets).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ArtifactError
from agent.util.pbwire import Data, WireError, spans

if TYPE_CHECKING:  # pragma: no cover
    from agent.artifacts.store import ContentStore

CHUNKER = "onnx-tensors+fastcdc-v1"
CHUNKERS = (CHUNKER, "fastcdc-v1", "onnx-tensors-v1")
MIN_SIZE, AVG_SIZE, MAX_SIZE = 16 * 1024, 64 * 1024, 256 * 1024
TENSOR_MIN = 4096  # tensors smaller than this are not worth a cut of their own
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Layout:
    """The chunks of one artifact as the puller and staging see them (chunk_size 0: variable chunks)."""

    sha256: str
    size: int
    chunks: tuple[str, ...]
    lens: tuple[int, ...]
    offsets: tuple[int, ...]
    chunk_size: int = 0

    @classmethod
    def from_recipe(cls, sha256: str, size: int, recipe: dict[str, Any]) -> "Layout":
        hashes = tuple(c[0] for c in recipe["chunks"])
        lens = tuple(int(c[1]) for c in recipe["chunks"])
        if sum(lens) != size:
            raise ArtifactError(f"recipe of {sha256[:16]} covers {sum(lens)} bytes, the artifact has {size}")
        return cls(sha256, size, hashes, lens, (0, *accumulate(lens))[:-1])

    @property
    def count(self) -> int:
        return len(self.chunks)

    def chunk_len(self, index: int) -> int:
        return self.lens[index]

    def offset(self, index: int) -> int:
        return self.offsets[index]


def tensor_cuts(data: Data) -> list[tuple[int, int]]:
    """(start, end) of every large ONNX initializer's raw data ([] when `data` is not an ONNX model).

    Read from the protobuf wire format in place (ModelProto.graph -> GraphProto.initializer ->
    TensorProto.raw_data), so `data` may be an mmap of a model of any size: nothing is copied or parsed into
    objects (onnx.load of a 64 MB model took ~190 MB of memory on a device computing the recipe of a version it
    held). Anything that is not a well-formed message at these three levels gives []."""
    try:
        graph = _field(data, 0, len(data), MODEL_GRAPH)
        if graph is None:
            return []
        cuts = []
        for a, b in spans(data, *graph, GRAPH_INITIALIZER):
            raw = _field(data, a, b, TENSOR_RAW_DATA)
            if raw is not None and raw[1] - raw[0] >= TENSOR_MIN:
                cuts.append(raw)
        return cuts
    except WireError:
        return []


MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW_DATA = 7, 5, 9  # field numbers in onnx.proto3


def _field(data: Data, start: int, end: int, wanted: int) -> tuple[int, int] | None:
    found = spans(data, start, end, wanted)
    return found[-1] if found else None  # protobuf: the last occurrence of a singular field wins


def _cdc(view: Data, start: int, end: int) -> list[int]:
    """FastCDC cut points strictly inside [start, end)."""
    try:
        from fastcdc.fastcdc_cy import fastcdc_cy
    except ImportError:  # fastcdc publishes compiled wheels for x86_64 only: Arm devices reuse by manifest recipe
        raise ArtifactError(
            "content-defined chunking needs fastcdc (pip install fastcdc; compiled wheels exist for x86_64), "
            "or push with --no-delta"
        ) from None

    if end - start <= MIN_SIZE:
        return []
    out = [start + c.offset for c in fastcdc_cy(view[start:end], MIN_SIZE, AVG_SIZE, MAX_SIZE, False, None)]
    return out[1:]


def cut_points(data: Data, chunker: str = CHUNKER) -> list[int]:
    """Sorted chunk start offsets of `data` (bytes or an mmap), always starting at 0."""
    if chunker not in CHUNKERS:
        raise ArtifactError(f"unknown chunker {chunker!r}: this agent knows {list(CHUNKERS)}")
    size = len(data)
    if size == 0:
        return [0]
    view = memoryview(data)
    tensors = dict(tensor_cuts(data)) if chunker != "fastcdc-v1" else {}
    bounds = sorted({0, size, *tensors, *tensors.values()})
    starts = set(bounds[:-1])
    for a, b in zip(bounds, bounds[1:]):
        if a in tensors or chunker == "onnx-tensors-v1":
            starts.update(range(a + MAX_SIZE, b, MAX_SIZE))  # fixed pieces from the tensor's start
        else:
            starts.update(_cdc(view, a, b))
    view.release()
    return sorted(starts)


def compute_recipe(path: str | os.PathLike[str], chunker: str = CHUNKER) -> dict[str, Any] | None:
    """The recipe of a file; None for an empty file or a gzip stream (compressed bytes do not chunk)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0 or f.read(2) == GZIP_MAGIC:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            starts = cut_points(mm, chunker)
            ends = starts[1:] + [len(mm)]
            chunks = [[hashlib.sha256(mm[a:b]).hexdigest(), b - a] for a, b in zip(starts, ends)]
    return {"chunker": chunker, "chunks": chunks}


class RecipeBook:
    """root/recipes/<blob sha>.json beside a ContentStore: which chunks each held blob is made of.

    `index()` is the device's chunk store view: chunk sha256 -> (blob path, offset, length) over every blob it
    holds. Chunks live inside the blobs (no second copy on a small disk); the store's GC, which keeps the
    committed and previous slots' blobs, therefore keeps their chunks and collects the rest; recipes of
    collected blobs are dropped here."""

    def __init__(self, store: ContentStore) -> None:
        self.store = store
        self.root = Path(store.root) / "recipes"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.json"

    def get(self, sha256: str, chunker: str | None = CHUNKER) -> dict[str, Any] | None:
        """The saved recipe made with `chunker` (None: with any chunker this agent knows)."""
        from agent.util.atomic import read_json

        try:
            rec = read_json(self.path(sha256))
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("chunker") not in CHUNKERS:
            return None
        return rec if chunker in (None, rec["chunker"]) else None

    def put(self, sha256: str, recipe: dict[str, Any]) -> None:
        from agent.util.atomic import atomic_write_json

        atomic_write_json(self.path(sha256), recipe)

    def ensure(self, sha256: str, chunker: str | None = CHUNKER) -> dict[str, Any] | None:
        """The blob's recipe, computed and saved when missing (a version pulled before recipes existed)."""
        rec = self.get(sha256, chunker)
        if rec is None and self.store.has(sha256):
            try:
                rec = compute_recipe(self.store.path(sha256), chunker or CHUNKER)
            except ArtifactError:  # no fastcdc here: a blob pulled before recipes existed offers nothing to reuse
                return None
            if rec is not None:
                self.put(sha256, rec)
        return rec

    def index(self, chunker: str = CHUNKER, skip: str | None = None) -> dict[str, tuple[Path, int, int]]:
        """chunk sha256 -> (blob path, offset, length) over every held blob (but `skip`); prunes orphan recipes."""
        held = set(self.store.list())
        for p in self.root.glob("*.json"):
            if p.stem not in held:
                p.unlink(missing_ok=True)
        out: dict[str, tuple[Path, int, int]] = {}
        for sha in sorted(held - {skip}):
            rec = self.ensure(sha, chunker)
            if rec is None:
                continue
            offset = 0
            for chunk_sha, length in rec["chunks"]:
                out.setdefault(chunk_sha, (self.store.path(sha), offset, length))
                offset += length
        return out
