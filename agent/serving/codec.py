"""Open Inference Protocol tensor encoding: KServe v2 datatypes, JSON tensors and the binary data extension."""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.serving.errors import BadRequest, InferenceFailed

# KServe v2 datatype -> numpy dtype name. BYTES travels as an object array of str: ONNX string tensors
# hold text and onnxruntime's Python binding str()s bytes objects, so elements must be UTF-8.
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
    "BF16": "bfloat16",
}
_LITTLE = sys.byteorder == "little"  # wire order is little-endian: native dtypes (the singletons) need no swap
_BYTES_NAMES = {"object", "str", "string", "bytes", "bytes_", "str_"}
_BY_NUMPY = {v: k for k, v in DATATYPES.items()}


def _bf16():
    try:
        import ml_dtypes  # shipped with onnx; numpy itself has no bfloat16
    except ImportError as exc:  # pragma: no cover - onnx depends on ml_dtypes
        raise BadRequest("BF16 tensors need the ml_dtypes package, which is not installed") from exc
    return np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype for a KServe datatype name; BadRequest if the name is unknown."""
    name = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if name is None:
        raise BadRequest(f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    return _bf16() if name == "bfloat16" else np.dtype(name)


def datatype_of(dtype: Any) -> str:
    """KServe datatype name for a numpy dtype or dtype name ("float32" -> "FP32", object/str -> "BYTES")."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name in _BYTES_NAMES or name.startswith(("str", "bytes", "<U", "|S")):
        return "BYTES"
    if name not in _BY_NUMPY:
        raise BadRequest(f"dtype {name!r} has no Open Inference Protocol datatype")
    return _BY_NUMPY[name]


def config_type(datatype: str) -> str:
    """Triton model-config type ("FP32" -> "TYPE_FP32", "BYTES" -> "TYPE_STRING")."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


@dataclass
class InferRequest:
    """A decoded infer request: numpy inputs in request order and the outputs asked for."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None  # None: all outputs
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output
    binary_default: bool = False
    id: str | None = None


def _shape(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw):
        raise BadRequest(f"{where}: 'shape' must be a list of non-negative integers, got {raw!r}")
    return tuple(raw)


def _flatten(data: Any) -> list:
    out: list = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _json_bytes(name: str, data: Any, count: int) -> np.ndarray:
    flat = _flatten(data) if isinstance(data, list) else [data]
    if len(flat) != count:
        raise BadRequest(f"input {name!r}: shape holds {count} elements but 'data' has {len(flat)}")
    if not all(isinstance(s, str) for s in flat):
        raise BadRequest(f"input {name!r}: BYTES data in JSON must be strings")
    arr = np.empty(count, dtype=object)
    arr[:] = flat
    return arr


_KINDS = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}


def _json_numeric(name: str, data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    try:
        raw = np.array(data)
    except (ValueError, OverflowError, RecursionError) as exc:
        raise BadRequest(f"input {name!r}: 'data' is not a regular array ({exc})") from None
    kind = "f" if dtype.name == "bfloat16" else dtype.kind
    if raw.size and raw.dtype.kind not in _KINDS[kind]:
        raise BadRequest(f"input {name!r}: 'data' holds {raw.dtype.kind!r}-kind values, not {dtype.name}")
    if raw.size != count:
        raise BadRequest(f"input {name!r}: shape holds {count} elements but 'data' has {raw.size}")
    if kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        if int(raw.min()) < info.min or int(raw.max()) > info.max:
            raise BadRequest(f"input {name!r}: values out of range for {dtype.name}")
    return raw.astype(dtype, copy=False).reshape(-1)


def _parse_bytes(name: str, blob: memoryview, count: int) -> np.ndarray:
    arr = np.empty(count, dtype=object)
    pos, end = 0, len(blob)
    for i in range(count):
        if pos + 4 > end:
            raise BadRequest(f"input {name!r}: BYTES data ends after {i} of {count} elements")
        (n,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        if pos + n > end:
            raise BadRequest(f"input {name!r}: BYTES element {i} claims {n} bytes past the end of its data")
        try:
            arr[i] = str(blob[pos : pos + n], "utf-8")
        except UnicodeDecodeError:
            raise BadRequest(
                f"input {name!r}: BYTES element {i} is not UTF-8 (ONNX string tensors carry text)"
            ) from None
        pos += n
    if pos != end:
        raise BadRequest(f"input {name!r}: {end - pos} bytes left over after {count} BYTES elements")
    return arr


def _binary_tensor(name: str, blob: memoryview, dtype: np.dtype, shape: tuple[int, ...], count: int) -> np.ndarray:
    if dtype.kind == "O":
        return _parse_bytes(name, blob, count).reshape(shape)
    if len(blob) != count * dtype.itemsize:
        raise BadRequest(
            f"input {name!r}: binary_data_size {len(blob)} != {count} elements x {dtype.itemsize} bytes for shape {list(shape)}"
        )
    arr = np.frombuffer(blob, dtype=dtype if _LITTLE or dtype.itemsize == 1 else dtype.newbyteorder("<"), count=count)
    if dtype == np.bool_:
        arr = arr.view(np.uint8) != 0
    return arr.reshape(shape)


def _input(spec: Any, i: int, binary: memoryview, offset: int) -> tuple[str, np.ndarray, int]:
    if not isinstance(spec, dict):
        raise BadRequest(f"inputs[{i}] must be an object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{i}]: 'name' must be a non-empty string")
    dtype = numpy_dtype(spec.get("datatype"))
    shape = _shape(spec.get("shape"), f"input {name!r}")
    count = math.prod(shape)
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest(f"input {name!r}: 'parameters' must be an object")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(f"input {name!r}: binary_data_size must be a non-negative integer")
        if "data" in spec:
            raise BadRequest(f"input {name!r}: has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise BadRequest(f"input {name!r}: binary_data_size {size} runs past the end of the body")
        return name, (dtype, shape, count, offset, size), offset + size
    if "data" not in spec:
        raise BadRequest(f"input {name!r}: needs 'data' or parameters.binary_data_size")
    data = spec["data"]
    flat = _json_bytes(name, data, count) if dtype.kind == "O" else _json_numeric(name, data, dtype, count)
    return name, flat.reshape(shape), offset


def _outputs(raw: Any, req: InferRequest) -> None:
    if raw is None:
        return
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list")
    req.outputs = []
    for i, spec in enumerate(raw):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest(f"outputs[{i}] must be an object with a string 'name'")
        params = spec.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f"output {spec['name']!r}: 'parameters' must be an object")
        if params.get("classification"):
            raise BadRequest("the classification extension is not supported")
        req.outputs.append(spec["name"])
        if "binary_data" in params:
            req.binary[spec["name"]] = bool(params["binary_data"])


_PLANS: dict[tuple[bytes, int], tuple] = {}  # JSON header + binary length -> decoded layout (clients repeat headers)
_PLANS_MAX = 256


def decode_request(body: bytes | memoryview, header_length: int | None) -> InferRequest:
    """Decode an infer request body; header_length is the Inference-Header-Content-Length (None: all JSON)."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length {header_length} is outside the body of {len(body)} bytes")
    head = body if header_length is None else body[:header_length]
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    key = (bytes(head), len(binary)) if header_length is not None else None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(head, binary)
        if key is not None and plan[0] is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    layout, inputs, outputs, binary_map, binary_default, rid = plan
    if layout is not None:  # all inputs binary: views into this body (sizes were checked when the plan was made)
        inputs = {}
        for name, (dtype, shape, count, offset, size, wire) in layout:
            if wire is None:  # BYTES: length-prefixed elements, parsed per request
                inputs[name] = _parse_bytes(name, binary[offset : offset + size], count).reshape(shape)
                continue
            arr = np.frombuffer(binary, dtype=wire, count=count, offset=offset)
            inputs[name] = arr.reshape(shape) if dtype != np.bool_ else (arr.view(np.uint8) != 0).reshape(shape)
    # the plan's output list and binary map are shared between requests: read-only downstream
    return InferRequest(
        inputs=inputs,
        outputs=None if outputs is None else list(outputs),
        binary=binary_map,
        binary_default=binary_default,
        id=rid,
    )


def _plan(head: bytes | memoryview, binary: memoryview) -> tuple:
    """Parse and check the JSON header: (binary layout or None, JSON inputs, outputs, binary map, default, id)."""
    try:
        doc = json.loads(bytes(head) if isinstance(head, memoryview) else head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest("the request must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    layout: list | None = []
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, spec in enumerate(raw_inputs):
        name, got, offset = _input(spec, i, binary, offset)
        if name in inputs:
            raise BadRequest(f"input {name!r} appears twice")
        if isinstance(got, tuple):
            dtype, shape, count, start, size = got
            got = _binary_tensor(name, binary[start : start + size], dtype, shape, count)  # validates the size
            if layout is not None:
                wire = (
                    None if dtype.kind == "O" else dtype if _LITTLE or dtype.itemsize == 1 else dtype.newbyteorder("<")
                )
                layout.append((name, (dtype, shape, count, start, size, wire)))
        else:
            layout = None
        inputs[name] = got
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    rid = doc.get("id")
    req = InferRequest(
        inputs={},
        binary_default=bool(params.get("binary_data_output", False)),
        id=rid if isinstance(rid, str) else None,
    )
    _outputs(doc.get("outputs"), req)
    return (
        tuple(layout) if layout is not None else None,
        inputs,
        None if req.outputs is None else tuple(req.outputs),
        req.binary,
        req.binary_default,
        req.id,
    )


def _binary_blob(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for item in arr.reshape(-1):
            b = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    return np.ascontiguousarray(
        arr, dtype=arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
    ).tobytes()


def _json_data(arr: np.ndarray, datatype: str) -> list:
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    if datatype == "BF16":
        flat = flat.astype(np.float32)
    return flat.tolist()


_HEADS: dict[tuple, bytes] = {}  # response JSON header by (model, version, id, output layout): clients repeat requests
_HEADS_MAX = 256


def _wire_ready(arr: np.ndarray) -> bool:
    """Can the array's own memory go on the wire as binary data (C-contiguous, little-endian, numeric)?"""
    dtype = arr.dtype
    return arr.flags.c_contiguous and dtype.kind in "biuf" and (dtype.itemsize == 1 or (_LITTLE and dtype.isnative))


def encode_response(
    model: str, version: str, outputs: dict[str, np.ndarray], req: InferRequest
) -> tuple[list, int, int | None]:
    """Response body as buffers to send in order (binary outputs go out from the arrays' own memory, no copy),
    its total length, and its JSON header length (None when the body is plain JSON)."""
    layout = []
    for name, value in outputs.items():
        if type(value) is not np.ndarray or not req.binary.get(name, req.binary_default) or not _wire_ready(value):
            return _encode_general(model, version, outputs, req)
        layout.append((name, value.dtype, value.shape))
    key = (model, version, req.id, tuple(layout))
    head = _HEADS.get(key)
    if head is None:
        head, _, _ = _encode_general(model, version, outputs, req, head_only=True)
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        _HEADS[key] = head
    parts, total = [head], len(head)
    for value in outputs.values():
        if value.nbytes:  # an empty tensor has no bytes (and its buffer cannot be cast to bytes)
            parts.append(value)
            total += value.nbytes
    return parts, total, len(head)


def carriable(name: str, value: Any) -> np.ndarray:
    """The output as an array OIP can carry; InferenceFailed (500, a clear message) for sequences and maps
    (skl2onnx's ZipMap gives a list of dicts), which would otherwise go out as a Python repr."""
    if isinstance(value, np.ndarray) and value.dtype.kind != "O":
        return value
    if isinstance(value, np.ndarray) and all(isinstance(x, (str, bytes)) for x in value.flat[:1]):
        return value
    first = value[0] if isinstance(value, (list, tuple)) and value else value
    kind = f"sequence of {type(first).__name__}" if isinstance(value, (list, tuple)) else type(value).__name__
    raise InferenceFailed(
        f"output {name!r} is a {kind}, which the Open Inference Protocol cannot carry (it serves tensors only); "
        "qualification refuses such models: convert with options={'zipmap': False} (skl2onnx) or end the graph "
        "in tensors"
    )


def _encode_general(
    model: str, version: str, outputs: dict[str, np.ndarray], req: InferRequest, head_only: bool = False
) -> tuple:
    entries, blobs = [], []
    for name, value in outputs.items():
        arr = carriable(name, value)
        datatype = datatype_of(arr.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if req.binary.get(name, req.binary_default):
            if head_only:  # the caller sends the array itself: its bytes are the wire bytes (_wire_ready)
                size = arr.nbytes
            else:
                blobs.append(_binary_blob(arr, datatype))
                size = len(blobs[-1])
            entry["parameters"] = {"binary_data_size": size}
        else:
            entry["data"] = _json_data(arr, datatype)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if head_only:
        return head, len(head), len(head)
    if not blobs:
        return [head], len(head), None
    return [head, *blobs], len(head) + sum(len(b) for b in blobs), len(head)
