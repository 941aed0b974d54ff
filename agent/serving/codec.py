"""Open Inference Protocol tensor encoding: KServe v2 datatypes, JSON tensors and the binary data extension."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from agent.datatypes import DATATYPES
from agent.serving.budget import BYTES_CHAR_FACTOR, BYTES_ELEMENT_COST, JSON_DECODE_FACTOR
from agent.serving.errors import BadRequest, InferenceFailed
from agent.serving.params import check_request, class_count
from agent.serving.shm import ShmOut, ShmSlot, input_slot, output_target

_LITTLE = sys.byteorder == "little"  # wire order is little-endian: native dtypes (the singletons) need no swap
_BYTES_NAMES = {"object", "str", "string", "bytes", "bytes_", "str_"}
_BY_NUMPY = {v: k for k, v in DATATYPES.items()}


def _bf16():
    try:
        import ml_dtypes  # shipped with onnx; numpy itself has no bfloat16
    except ImportError as exc:  # pragma: no cover - onnx depends on ml_dtypes
        raise BadRequest("BF16 tensors need the ml_dtypes package, which is not installed") from exc
    return np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(datatype: Any, where: str = "") -> np.dtype:
    """numpy dtype for a KServe datatype name; BadRequest naming the OIP datatypes if it is missing or unknown."""
    name = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if name is None:
        what = "'datatype' is missing" if datatype is None else f"unknown datatype {str(datatype)[:40]!r}"
        raise BadRequest(f"{where}{what}; expected one of {', '.join(DATATYPES)}")
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


Charge = Callable[[int, str], None]  # counts bytes against the request memory budget (budget.Ledger.charge)


def no_charge(n: int, what: str) -> None:
    return None


@dataclass
class InferRequest:
    """A decoded infer request: numpy inputs in request order and the outputs asked for."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None  # None: all outputs
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output
    binary_default: bool = False
    id: str | None = None
    classes: dict[str, int] = field(default_factory=dict)  # output -> class_count (classification extension)
    params: dict[str, Any] = field(default_factory=dict)  # the request's parameters (checked: params.py)
    shm_out: dict[str, ShmOut] = field(default_factory=dict)  # outputs to write to shared memory (shm.py)
    shm_written: dict[str, int] = field(default_factory=dict)  # ... and the bytes written, once they are


class BinarySlot(NamedTuple):
    """Where one binary input lies in the body's binary part, checked against its shape and datatype."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    elements: int
    offset: int
    size: int
    wire: np.dtype | None  # the little-endian dtype to read it as; None for BYTES (length-prefixed elements)


class Plan(NamedTuple):
    """A checked JSON header: reusable for every request that repeats it (binary inputs only)."""

    layout: tuple[BinarySlot, ...] | None  # None when some input carries JSON data (then `inputs` holds them)
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None
    binary: dict[str, bool]
    binary_default: bool
    id: str | None
    classes: dict[str, int]
    params: dict[str, Any]
    shm_out: dict[str, ShmOut]


_MAX_BYTES = 1 << 63  # numpy (and ONNX's int64 dims) cannot describe a tensor of this many bytes


def _shape(raw: Any, where: str, itemsize: int) -> tuple[tuple[int, ...], int]:
    """(shape, element count); BadRequest unless a list of non-negative integers that numpy can describe."""
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw):
        raise BadRequest(f"{where}: 'shape' must be a list of non-negative integers, got {str(raw)[:80]}")
    if len(raw) > 32:
        raise BadRequest(f"{where}: shape has {len(raw)} dimensions (at most 32)")
    span = max(itemsize, 1)  # the bytes numpy would index: zero dimensions aside
    count = 1
    for d in raw:
        if d:
            span *= d
        count *= d
    if span >= _MAX_BYTES:
        raise BadRequest(f"{where}: shape {raw} describes more than 2^63 bytes")
    return tuple(raw), count


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
    try:
        "".join(flat).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"input {name!r}: BYTES data holds a lone surrogate, which is not text") from None
    arr = np.empty(count, dtype=object)
    arr[:] = flat
    return arr


def _oip(dtype: np.dtype) -> str:
    return "BF16" if dtype.name == "bfloat16" else datatype_of(dtype)


def _exact_ints(name: str, data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    """Integer data numpy did not type as integers (huge values, or floats mixed in): checked one by one."""
    flat = _flatten(data) if isinstance(data, list) else [data]
    if len(flat) != count:
        raise BadRequest(f"input {name!r}: shape holds {count} elements but 'data' has {len(flat)}")
    info = np.iinfo(dtype)
    for v in flat:
        if not isinstance(v, int):
            raise BadRequest(f"input {name!r}: {_oip(dtype)} data must be integers, got {str(v)[:40]}")
        if not info.min <= v <= info.max:
            raise BadRequest(f"input {name!r}: {v} is out of range for {_oip(dtype)} ({info.min}..{info.max})")
    return np.array(flat, dtype=dtype)


def _json_numeric(name: str, data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    try:
        raw = np.array(data)
    except (ValueError, OverflowError, RecursionError, TypeError) as exc:
        raise BadRequest(f"input {name!r}: 'data' is not a regular array ({str(exc)[:120]})") from None
    kind = "f" if dtype.name == "bfloat16" else dtype.kind
    if raw.size != count:
        raise BadRequest(f"input {name!r}: shape holds {count} elements but 'data' has {raw.size}")
    if not raw.size:
        return np.empty(0, dtype=dtype)
    if kind in "iu":
        if raw.dtype.kind not in "biu":  # float64 or object: big integers numpy could not type, or non-integers
            return _exact_ints(name, raw.tolist() if raw.dtype.kind == "O" else data, dtype, count)
        info = np.iinfo(dtype)
        lo, hi = int(raw.min()), int(raw.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise BadRequest(f"input {name!r}: {bad} is out of range for {_oip(dtype)} ({info.min}..{info.max})")
        return raw.astype(dtype, copy=False).reshape(-1)
    if kind == "b":
        if raw.dtype.kind != "b":
            raise BadRequest(f"input {name!r}: BOOL data must be true or false")
        return raw.reshape(-1)
    if raw.dtype.kind == "O":  # integers too large for int64/uint64, maybe mixed with floats
        flat = raw.reshape(-1).tolist()
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
            raise BadRequest(f"input {name!r}: {_oip(dtype)} data must be numbers")
        try:
            raw = np.array([float(v) for v in flat])
        except OverflowError:
            raise BadRequest(f"input {name!r}: a value is out of range for {_oip(dtype)}") from None
    elif raw.dtype.kind not in "biuf":
        raise BadRequest(f"input {name!r}: {_oip(dtype)} data must be numbers")
    with np.errstate(over="ignore", invalid="ignore"):
        out = raw.astype(dtype).reshape(-1)
        finite = bool(np.isfinite(out if dtype.kind == "f" else out.astype(np.float32)).all())
    if not finite:
        raise BadRequest(
            f"input {name!r}: a value is out of range for {_oip(dtype)} (largest finite "
            f"{float(np.finfo(dtype).max):.8g}); JSON carries finite numbers only: send NaN or Inf as binary data"
        )
    return out


def _parse_bytes(name: str, blob: memoryview, count: int, charge: Charge = no_charge) -> np.ndarray:
    end = len(blob)
    if count * 4 > end:  # each element has at least its 4-byte length: checked before anything is allocated
        raise BadRequest(f"input {name!r}: shape holds {count} BYTES elements but its data has only {end} bytes")
    charge(count * BYTES_ELEMENT_COST + BYTES_CHAR_FACTOR * end, f"BYTES input {name!r}")
    arr = np.empty(count, dtype=object)
    pos = 0
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


def _wire_dtype(dtype: np.dtype) -> np.dtype | None:
    return None if dtype.kind == "O" else dtype if _LITTLE or dtype.itemsize == 1 else dtype.newbyteorder("<")


def _binary_tensor(slot: BinarySlot, binary: memoryview, charge: Charge = no_charge) -> np.ndarray:
    """The input's array: a view into the body (BYTES: parsed elements); the slot's size was checked."""
    if slot.wire is None:
        blob = binary[slot.offset : slot.offset + slot.size]
        return _parse_bytes(slot.name, blob, slot.elements, charge).reshape(slot.shape)
    arr = np.frombuffer(binary, dtype=slot.wire, count=slot.elements, offset=slot.offset)
    if slot.dtype == np.bool_:
        arr = arr.view(np.uint8) != 0
    return arr.reshape(slot.shape)


def _input(spec: Any, i: int, binary: memoryview, offset: int) -> np.ndarray | BinarySlot | ShmSlot:
    """One input: its JSON data as an array, or where its binary data lies (sizes checked, nothing allocated)."""
    if not isinstance(spec, dict):
        raise BadRequest(f"inputs[{i}] must be an object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{i}]: 'name' must be a non-empty string")
    where = f"input {name!r}"
    dtype = numpy_dtype(spec.get("datatype"), f"{where}: ")
    shape, count = _shape(spec.get("shape"), where, dtype.itemsize)
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object")
    if "shared_memory_region" in params:
        if "data" in spec or "binary_data_size" in params:
            raise BadRequest(f"{where}: has shared_memory_region and data of its own")
        return input_slot(name, dtype, shape, count, params)
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(f"{where}: binary_data_size must be a non-negative integer")
        if "data" in spec:
            raise BadRequest(f"{where}: has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise BadRequest(f"{where}: binary_data_size {size} runs past the end of the body")
        wire = _wire_dtype(dtype)
        if wire is not None and size != count * dtype.itemsize:
            raise BadRequest(
                f"{where}: binary_data_size {size} != {count} elements x {dtype.itemsize} bytes of "
                f"{_oip(dtype)} for shape {list(shape)}"
            )
        if wire is None and count * 4 > size:
            raise BadRequest(f"{where}: shape holds {count} BYTES elements but its data has only {size} bytes")
        return BinarySlot(name, dtype, shape, count, offset, size, wire)
    if "data" not in spec:
        raise BadRequest(f"{where}: needs 'data' or parameters.binary_data_size")
    data = spec["data"]
    flat = _json_bytes(name, data, count) if dtype.kind == "O" else _json_numeric(name, data, dtype, count)
    return flat.reshape(shape)


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
        count = class_count(spec["name"], params)
        if count is not None:
            req.classes[spec["name"]] = count
        target = output_target(spec["name"], params)
        if target is not None:
            req.shm_out[spec["name"]] = target
        req.outputs.append(spec["name"])
        if "binary_data" in params:
            req.binary[spec["name"]] = bool(params["binary_data"])


_PLANS: dict[tuple[bytes, int], Plan] = {}  # JSON header + binary length -> checked layout (clients repeat headers)
_PLANS_MAX = 256


def decode_request(body: bytes | memoryview, header_length: int | None, charge: Charge = no_charge) -> InferRequest:
    """Decode an infer request body; header_length is the Inference-Header-Content-Length (None: all JSON).
    `charge` counts what decoding will hold (JSON objects, BYTES strings) before it is allocated."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length {header_length} is outside the body of {len(body)} bytes")
    head = body if header_length is None else body[:header_length]
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    key = (bytes(head), len(binary)) if header_length is not None else None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(head, binary, charge)
        if key is not None and plan.layout is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    inputs = plan.inputs
    if plan.layout is not None:  # all inputs binary: views into this body (sizes were checked when the plan was made)
        inputs = {slot.name: _binary_tensor(slot, binary, charge) for slot in plan.layout}
    # the plan's output list and binary map are shared between requests: read-only downstream
    return InferRequest(
        inputs=inputs,
        outputs=None if plan.outputs is None else list(plan.outputs),
        binary=plan.binary,
        binary_default=plan.binary_default,
        id=plan.id,
        classes=plan.classes,
        params=plan.params,
        shm_out=dict(plan.shm_out),
    )


def _refuse_constant(token: str) -> Any:
    raise BadRequest(
        f"malformed JSON: {token} is not a JSON number (JSON carries finite numbers only; "
        "send NaN or Inf as binary data, parameters.binary_data_size)"
    )


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_json(text: bytes | memoryview, charge: Charge = no_charge, what: str = "the JSON request") -> Any:
    """Strict JSON (UTF-8, no NaN/Infinity), its decoded size counted first; BadRequest if malformed."""
    charge(len(text) * JSON_DECODE_FACTOR, what)
    try:
        return _DECODER.decode(str(text, "utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("malformed JSON: not UTF-8") from None
    except ValueError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None


def _plan(head: bytes | memoryview, binary: memoryview, charge: Charge) -> Plan:
    """Parse and check the JSON header (no binary input is read, and BYTES ones are parsed per request)."""
    doc = parse_json(head, charge, "the request's JSON")
    if not isinstance(doc, dict):
        raise BadRequest("the request must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    slots: list[BinarySlot] = []
    got: dict[str, np.ndarray | BinarySlot | ShmSlot] = {}
    offset = 0
    for i, spec in enumerate(raw_inputs):
        one = _input(spec, i, binary, offset)
        name = one.name if isinstance(one, BinarySlot) else spec["name"]
        if name in got:
            raise BadRequest(f"input {name!r} appears twice")
        got[name] = one
        if isinstance(one, BinarySlot):
            slots.append(one)
            offset += one.size
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    all_binary = len(slots) == len(got)
    inputs: dict[str, Any] = {}  # arrays, and ShmSlots the data plane reads when the request runs
    if not all_binary:  # mixed: this plan is not cached, so its binary inputs are read here
        for name, one in got.items():
            inputs[name] = _binary_tensor(one, binary, charge) if isinstance(one, BinarySlot) else one
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    check_request(params)
    rid = doc.get("id")
    req = InferRequest(
        inputs={},
        binary_default=bool(params.get("binary_data_output", False)),
        id=rid if isinstance(rid, str) else None,
    )
    _outputs(doc.get("outputs"), req)
    return Plan(
        tuple(slots) if all_binary else None,
        inputs,
        None if req.outputs is None else tuple(req.outputs),
        req.binary,
        req.binary_default,
        req.id,
        req.classes,
        params,
        req.shm_out,
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


def _json_safe(arr: np.ndarray, datatype: str) -> bool:
    """Can the tensor go out as JSON numbers? Not with NaN or Inf, which JSON lacks: such a tensor goes out as
    binary data (the binary tensor extension carries the IEEE values exactly, as Triton does)."""
    if datatype not in ("FP16", "FP32", "FP64", "BF16") or not arr.size:
        return True
    return bool(np.isfinite(arr if datatype != "BF16" else arr.astype(np.float32)).all())


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
    if req.shm_written:
        return _encode_general(model, version, outputs, req)
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
        if name in req.shm_written:  # its data lies in the client's shared memory region
            entry["parameters"] = {
                "shared_memory_region": req.shm_out[name].region,
                "shared_memory_byte_size": req.shm_written[name],
            }
        elif req.binary.get(name, req.binary_default) or not _json_safe(arr, datatype):
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
    head = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if head_only:
        return head, len(head), len(head)
    if not blobs:
        return [head], len(head), None
    return [head, *blobs], len(head) + sum(len(b) for b in blobs), len(head)
