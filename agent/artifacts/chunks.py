"""The binary wire format of chunk requests and responses on the artifact channel (docs/protocol.md).

request  (device -> {p}/artifacts/req/{device_id}):
    b"EAQ1" | sha256 (32 raw bytes) | chunk_size u32 | count u16 | count x index u32      (big-endian)
response (server -> {p}/devices/{device_id}/artifacts):
    b"EAC1" | sha256 (32 raw bytes) | chunk_size u32 | index u32 | status u8 | body
    status 0 = ok (body = chunk bytes), 1 = not found, 2 = bad request (body = UTF-8 reason)
chunk_size 0 (RECIPE) asks for chunks by their index in the artifact's chunk recipe (agent.artifacts.recipe:
variable-length, content-defined chunks of a delta pull); the server answers from the recipe it keeps.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from agent.errors import ArtifactError

REQ_MAGIC, RESP_MAGIC = b"EAQ1", b"EAC1"
_REQ = struct.Struct(">4s32sIH")
_RESP = struct.Struct(">4s32sIIB")
MAX_INDICES = 1024
OK, NOT_FOUND, BAD_REQUEST = 0, 1, 2
RECIPE = 0  # chunk_size of a request by recipe index


@dataclass(frozen=True)
class ChunkRequest:
    sha256: str
    chunk_size: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class ChunkResponse:
    sha256: str
    chunk_size: int
    index: int
    status: int
    body: bytes | memoryview

    @property
    def ok(self) -> bool:
        return self.status == OK


def _raw_sha(sha256: str) -> bytes:
    try:
        raw = bytes.fromhex(sha256)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 32:
        raise ArtifactError(f"bad sha256 {sha256!r}")
    return raw


def encode_request(sha256: str, chunk_size: int, indices: Iterable[int]) -> bytes:
    wanted = list(indices)
    if not 1 <= len(wanted) <= MAX_INDICES:
        raise ArtifactError(f"a chunk request carries 1-{MAX_INDICES} indices, got {len(wanted)}")
    return _REQ.pack(REQ_MAGIC, _raw_sha(sha256), chunk_size, len(wanted)) + struct.pack(f">{len(wanted)}I", *wanted)


def decode_request(data: bytes) -> ChunkRequest:
    """Parse a request; ArtifactError on anything malformed (never another exception)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < _REQ.size:
        raise ArtifactError("chunk request too short")
    magic, sha, chunk_size, count = _REQ.unpack_from(data)
    if magic != REQ_MAGIC:
        raise ArtifactError("not a chunk request (bad magic)")
    if not 1 <= count <= MAX_INDICES or len(data) != _REQ.size + 4 * count:
        raise ArtifactError("chunk request has a bad index count")
    indices = struct.unpack_from(f">{count}I", data, _REQ.size)
    return ChunkRequest(sha.hex(), chunk_size, indices)


def encode_response(sha256: str, chunk_size: int, index: int, status: int, body: bytes) -> bytes:
    return _RESP.pack(RESP_MAGIC, _raw_sha(sha256), chunk_size, index, status) + body


def response_header(sha256: str, chunk_size: int, index: int, status: int = OK) -> bytes:
    return _RESP.pack(RESP_MAGIC, _raw_sha(sha256), chunk_size, index, status)


def peek_sha(data: bytes) -> str | None:
    """The artifact a response belongs to, or None if it is not a response (cheap: for routing in callbacks)."""
    if isinstance(data, (bytes, bytearray)) and len(data) >= _RESP.size and data[:4] == RESP_MAGIC:
        return bytes(data[4:36]).hex()
    return None


def decode_response(data: bytes) -> ChunkResponse:
    if not isinstance(data, (bytes, bytearray)) or len(data) < _RESP.size:
        raise ArtifactError("chunk response too short")
    magic, sha, chunk_size, index, status = _RESP.unpack_from(data)
    if magic != RESP_MAGIC:
        raise ArtifactError("not a chunk response (bad magic)")
    if status not in (OK, NOT_FOUND, BAD_REQUEST):
        raise ArtifactError(f"chunk response has unknown status {status}")
    return ChunkResponse(sha.hex(), chunk_size, index, status, memoryview(data)[_RESP.size :])
