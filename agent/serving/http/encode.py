"""REST infer response encoding: binary outputs go out from the arrays' own memory (the JSON header cached per
layout: clients repeat requests), numeric JSON outputs as a cached body with only their numbers encoded per
request, anything else through the general encoder (BYTES, NaN/Inf, mixed binary and JSON, swapped or BYTES
blobs, shared-memory entries)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from agent.serving.binary import binary_blob, wire_ready
from agent.serving.codec import InferRequest, carriable, datatype_of
from agent.serving.http.jsondata import json_data, json_safe

_HEADS: dict[
    tuple[Any, ...], bytes
] = {}  # response JSON header by (model, version, id, output layout): clients repeat requests
_BODIES: dict[tuple[Any, ...], tuple[bytes, ...]] = {}  # JSON body around each output's `data`, by the same key
_HEADS_MAX = 256
_MARK = "\x00data\x00"  # stands for an output's data while its body is cut (JSON writes it \u0000data\u0000)
_NUMERIC = frozenset("biuf")  # kinds whose `data` is tolist() as JSON numbers (bfloat16, kind V, converts first)
_ID_MAX = 256  # a response whose id is longer is encoded each time (the cache's memory stays bounded)


def encode_response(
    model: str, version: str, outputs: dict[str, np.ndarray], req: InferRequest
) -> tuple[list[Any], int, int | None]:
    """Response body as buffers to send in order (binary outputs go out from the arrays' own memory, no copy),
    its total length, and its JSON header length (None when the body is plain JSON)."""
    if req.shm_written:
        return _shm_only(model, version, outputs, req)
    layout = []
    as_json = 0
    for name, value in outputs.items():
        if type(value) is not np.ndarray:
            return encode_general(model, version, outputs, req)
        if req.binary.get(name, req.binary_default):
            if not wire_ready(value):
                return encode_general(model, version, outputs, req)
        elif value.dtype.kind in _NUMERIC:
            as_json += 1
        else:
            return encode_general(model, version, outputs, req)
        layout.append((name, value.dtype, value.shape))
    key = (model, version, req.id, tuple(layout))
    if as_json:
        return (
            _json_only(key, model, version, outputs, req)
            if as_json == len(layout)
            else encode_general(model, version, outputs, req)
        )
    head = _HEADS.get(key)
    if head is None:
        head, _, _ = encode_general(model, version, outputs, req, head_only=True)
        _keep(_HEADS, key, head, req)
    parts, total = [head], len(head)
    for value in outputs.values():
        if value.nbytes:  # an empty tensor has no bytes (and its buffer cannot be cast to bytes)
            parts.append(value)
            total += value.nbytes
    return parts, total, len(head)


def _json_only(
    key: tuple[Any, ...], model: str, version: str, outputs: dict[str, np.ndarray], req: InferRequest
) -> tuple[Any, ...]:
    """Every output numeric and asked for as JSON: the cached body with each output's numbers put in (the general
    encoder's bytes: its encoder on the same tolist()); NaN or Inf (the encoder refuses them) go the general way."""
    cut = _BODIES.get(key)
    if cut is None:
        head = encode_general(model, version, outputs, req, marked=True)[0][0]
        pieces = tuple(head.split(_JSON.encode(_MARK).encode()))
        if len(pieces) != len(outputs) + 1:  # the mark also stands in a name or the id: never cached
            return encode_general(model, version, outputs, req)
        _keep(_BODIES, key, pieces, req)
        cut = pieces
    parts = [cut[0]]
    try:
        for value, tail in zip(outputs.values(), cut[1:]):
            parts.append(_JSON.encode(value.reshape(-1).tolist()).encode())
            parts.append(tail)
    except ValueError:  # NaN or Inf, which JSON lacks: binary data
        return encode_general(model, version, outputs, req)
    body = b"".join(parts)
    return [body], len(body), None


def _keep(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any, req: InferRequest) -> None:
    if req.id is not None and len(req.id) > _ID_MAX:
        return
    if len(cache) >= _HEADS_MAX:
        cache.clear()
    cache[key] = value


def _shm_only(model: str, version: str, outputs: dict[str, np.ndarray], req: InferRequest) -> tuple[Any, ...]:
    """Every output lies in the client's shared memory: the JSON alone, cached per layout like binary heads."""
    layout = []
    for name, value in outputs.items():
        written = req.shm_written.get(name)
        if written is None or type(value) is not np.ndarray:
            return encode_general(model, version, outputs, req)
        layout.append((name, value.dtype, value.shape, req.shm_out[name].region, written))
    key = ("shm", model, version, req.id, tuple(layout))
    head = _HEADS.get(key)
    if head is None:
        head = encode_general(model, version, outputs, req)[0][0]
        _keep(_HEADS, key, head, req)
    return [head], len(head), None


_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # one encoder (json.dumps makes one a call)


def encode_general(
    model: str,
    version: str,
    outputs: dict[str, np.ndarray],
    req: InferRequest,
    head_only: bool = False,
    marked: bool = False,
) -> tuple[Any, ...]:
    """The response (as encode_response returns it); `head_only`: the JSON header alone, `marked`: every output's
    `data` replaced by _MARK (the caller cuts the body there)."""
    entries, blobs = [], []
    for name, value in outputs.items():
        arr = carriable(name, value)
        datatype = datatype_of(arr.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if name in req.shm_written:  # its data lies in the client's shared memory region
            entry["parameters"] = {
                "shared_memory_region": req.shm_out[name].region,
                "shared_memory_byte_size": req.shm_written[name],
            }
        elif marked:
            entry["data"] = _MARK
        elif req.binary.get(name, req.binary_default) or not json_safe(arr, datatype):
            if head_only:  # the caller sends the array itself: its bytes are the wire bytes (wire_ready)
                size = arr.nbytes
            else:
                blobs.append(binary_blob(arr, datatype))
                size = len(blobs[-1])
            entry["parameters"] = {"binary_data_size": size}
        else:
            entry["data"] = json_data(arr, datatype)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    head = _JSON.encode(doc).encode()
    if head_only:
        return head, len(head), len(head)
    if not blobs:
        return [head], len(head), None
    return [head, *blobs], len(head) + sum(len(b) for b in blobs), len(head)
