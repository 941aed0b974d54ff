"""The manifest's parts: the artifact (size, chunk hashes, format, delta recipe), its download sources and its
targeting, each a frozen dataclass with a strict parser that raises ManifestRejected."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from agent.artifacts.manifest.rejection import ManifestRejected
from agent.names import is_valid_name

FORMATS = ("onnx", "tar.gz")
MIN_CHUNK = 1024
MAX_CHUNK = 8 * 1024 * 1024
MAX_CHUNKS = 65536
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
ARTIFACT_KEYS = {"sha256", "size", "chunk_size", "chunks", "format"}
ARTIFACT_OPTIONAL = {"recipe"}  # content-defined chunks for delta pulls (agent.artifacts.recipe); older agents
# refuse a manifest with it, so `fleet push --no-delta` leaves it out


class _ArtifactOptional(TypedDict, total=False):
    recipe: dict[str, Any]  # {"chunker", "chunks": [[sha256, length], ...]}: present for a delta-capable artifact


class ArtifactFields(_ArtifactOptional):
    """A manifest's artifact fields as JSON (Artifact.to_dict; what fleet.push.store_package stores)."""

    sha256: str
    size: int
    chunk_size: int
    chunks: list[str]
    format: str


@dataclass(frozen=True)
class Artifact:
    sha256: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]
    format: str = "onnx"
    recipe: Mapping[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.chunks)

    def chunk_len(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def offset(self, index: int) -> int:
        return index * self.chunk_size

    def to_dict(self) -> ArtifactFields:
        out: ArtifactFields = {
            "sha256": self.sha256,
            "size": self.size,
            "chunk_size": self.chunk_size,
            "chunks": list(self.chunks),
            "format": self.format,
        }
        if self.recipe is not None:
            out["recipe"] = {"chunker": self.recipe["chunker"], "chunks": [list(c) for c in self.recipe["chunks"]]}
        return out


@dataclass(frozen=True)
class Source:
    type: str  # "mqtt" | "http"
    url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type} if self.url is None else {"type": self.type, "url": self.url}


def malformed(reason: str, d: object = None) -> ManifestRejected:
    name = d.get("name") if isinstance(d, dict) and isinstance(d.get("name"), str) else None
    version = d.get("version") if isinstance(d, dict) and isinstance(d.get("version"), str) else None
    return ManifestRejected("malformed", reason, (name or "")[:64] or None, (version or "")[:32] or None)


def bounded_int(d: dict[str, Any], key: str, lo: int, hi: int, where: str, whole: object) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise malformed(f"{where}{key} must be an integer in [{lo}, {hi}], got {v!r}"[:200], whole)
    return v


def parse_artifact(a: object, whole: object) -> Artifact:
    if not isinstance(a, dict) or not ARTIFACT_KEYS <= set(a) <= ARTIFACT_KEYS | ARTIFACT_OPTIONAL:
        raise malformed(f"artifact must have the keys {sorted(ARTIFACT_KEYS)} (and optionally 'recipe')", whole)
    sha = a["sha256"]
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise malformed("artifact.sha256 must be 64 lower-case hex digits", whole)
    size = bounded_int(a, "size", 1, 2**50, "artifact.", whole)
    chunk = bounded_int(a, "chunk_size", MIN_CHUNK, MAX_CHUNK, "artifact.", whole)
    chunks = a["chunks"]
    if not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        raise malformed(f"artifact.chunks must be a list of at most {MAX_CHUNKS} hashes", whole)
    if len(chunks) != math.ceil(size / chunk):
        raise malformed(
            f"artifact.chunks has {len(chunks)} hashes; size/chunk_size needs {math.ceil(size / chunk)}", whole
        )
    if not all(isinstance(c, str) and _HEX64.fullmatch(c) for c in chunks):
        raise malformed("artifact.chunks must hold 64 lower-case hex digits each", whole)
    if a["format"] not in FORMATS:
        raise malformed(f"artifact.format must be one of {list(FORMATS)}", whole)
    recipe = _parse_recipe(a["recipe"], size, whole) if "recipe" in a else None
    return Artifact(sha, size, chunk, tuple(chunks), a["format"], recipe)


def _parse_recipe(r: object, size: int, whole: object) -> dict[str, Any]:
    """{"chunker": str, "chunks": [[sha256, length], ...]} whose lengths add up to the artifact's size."""
    if not isinstance(r, dict) or set(r) != {"chunker", "chunks"} or not isinstance(r["chunker"], str):
        raise malformed("artifact.recipe must be {'chunker': str, 'chunks': [[sha256, length], ...]}", whole)
    items = r["chunks"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_CHUNKS:
        raise malformed(f"artifact.recipe.chunks must list 1-{MAX_CHUNKS} chunks", whole)
    total = 0
    for c in items:
        ok = isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and _HEX64.fullmatch(c[0])
        if not ok or isinstance(c[1], bool) or not isinstance(c[1], int) or not 1 <= c[1] <= MAX_CHUNK:
            raise malformed("artifact.recipe.chunks holds [64 hex digits, length 1..8 MiB] pairs", whole)
        total += c[1]
    if total != size:
        raise malformed(f"artifact.recipe covers {total} bytes; the artifact has {size}", whole)
    return {"chunker": r["chunker"][:64], "chunks": [tuple(c) for c in items]}


def parse_sources(s: object, whole: object) -> tuple[Source, ...]:
    if not isinstance(s, list) or not 1 <= len(s) <= 8:
        raise malformed("sources must be a list of 1-8 sources", whole)
    out = []
    for src in s:
        if isinstance(src, dict) and src == {"type": "mqtt"}:
            out.append(Source("mqtt"))
        elif (
            isinstance(src, dict)
            and set(src) == {"type", "url"}
            and src["type"] == "http"
            and isinstance(src["url"], str)
            and re.fullmatch(r"https?://[^\s]{1,2000}", src["url"])
        ):
            out.append(Source("http", src["url"]))
        else:
            raise malformed(
                f"unknown source {str(src)[:100]}: use {{'type': 'mqtt'}} or {{'type': 'http', 'url': 'https://...'}}",
                whole,
            )
    return tuple(out)


def parse_targeting(t: object, whole: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(t, dict) or set(t) != {"devices", "groups"}:
        raise malformed("targeting must be {'devices': [...], 'groups': [...]}", whole)
    out = []
    for key in ("devices", "groups"):
        items = t[key]
        if not isinstance(items, list) or len(items) > 10000:
            raise malformed(f"targeting.{key} must be a list", whole)
        for item in items:
            if not is_valid_name(item):
                raise ManifestRejected("invalid-name", f"targeting.{key} holds an invalid name {str(item)[:80]!r}")
        out.append(tuple(items))
    if not out[0] and not out[1]:
        raise malformed("targeting names no device and no group", whole)
    return out[0], out[1]
