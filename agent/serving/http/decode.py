"""REST infer request decoding (KServe v2 JSON with the binary tensor data extension): the JSON header checked once
into a Plan (cached: clients repeat headers), binary inputs read in place from the body for every request."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from agent.serving.binary import BinarySlot, binary_tensor, wire_dtype
from agent.serving.codec import Charge, InferRequest, no_charge, numpy_dtype, oip_name
from agent.serving.errors import InvalidInput
from agent.serving.http import jsonplan
from agent.serving.http.jsondata import json_tensor
from agent.serving.http.jsonfast import FAST_MIN, NumericData, parse_infer
from agent.serving.params import check_request, class_count
from agent.serving.shm import ShmOut, ShmSlot, input_slot, output_target


class Plan(NamedTuple):
    """A checked JSON header: reusable for every request that repeats it (binary and shared-memory inputs only)."""

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
    """(shape, element count); InvalidInput unless a list of non-negative integers that numpy can describe."""
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw):
        raise InvalidInput(f"{where}: 'shape' must be a list of non-negative integers, got {str(raw)[:80]}")
    if len(raw) > 32:
        raise InvalidInput(f"{where}: shape has {len(raw)} dimensions (at most 32)")
    span = max(itemsize, 1)  # the bytes numpy would index: zero dimensions aside
    count = 1
    for d in raw:
        if d:
            span *= d
        count *= d
    if span >= _MAX_BYTES:
        raise InvalidInput(f"{where}: shape {raw} describes more than 2^63 bytes")
    return tuple(raw), count


def _input(spec: Any, i: int, binary: memoryview, offset: int, charge: Charge) -> np.ndarray | BinarySlot | ShmSlot:
    """One input: its JSON data as an array, or where its binary data lies (sizes checked, nothing allocated)."""
    if not isinstance(spec, dict):
        raise InvalidInput(f"inputs[{i}] must be an object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"inputs[{i}]: 'name' must be a non-empty string")
    where = f"input {name!r}"
    dtype = numpy_dtype(spec.get("datatype"), f"{where}: ")
    shape, count = _shape(spec.get("shape"), where, dtype.itemsize)
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput(f"{where}: 'parameters' must be an object")
    if "shared_memory_region" in params:
        if "data" in spec or "binary_data_size" in params:
            raise InvalidInput(f"{where}: has shared_memory_region and data of its own")
        return input_slot(name, dtype, shape, count, params)
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"{where}: binary_data_size must be a non-negative integer")
        if "data" in spec:
            raise InvalidInput(f"{where}: has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise InvalidInput(f"{where}: binary_data_size {size} runs past the end of the body")
        wire = wire_dtype(dtype)
        if wire is not None and size != count * dtype.itemsize:
            raise InvalidInput(
                f"{where}: binary_data_size {size} != {count} elements x {dtype.itemsize} bytes of "
                f"{oip_name(dtype)} for shape {list(shape)}"
            )
        if wire is None and count * 4 > size:
            raise InvalidInput(f"{where}: shape holds {count} BYTES elements but its data has only {size} bytes")
        return BinarySlot(name, dtype, shape, count, offset, size, wire)
    if "data" not in spec:
        raise InvalidInput(f"{where}: needs 'data' or parameters.binary_data_size")
    data = spec["data"]
    if isinstance(data, NumericData):  # a large body's numbers, parsed but not yet converted (jsonfast.py)
        return data.tensor(name, dtype, count, charge).reshape(shape)
    return json_tensor(name, data, dtype, count).reshape(shape)


def _outputs(raw: Any, req: InferRequest) -> None:
    if raw is None:
        return
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list")
    req.outputs = []
    for i, spec in enumerate(raw):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidInput(f"outputs[{i}] must be an object with a string 'name'")
        params = spec.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput(f"output {spec['name']!r}: 'parameters' must be an object")
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
_PLAN_KEY_MAX = 8192  # longer JSON headers are parsed every time (the cache's memory stays bounded: 256 x 8 KiB)


def _reusable(plan: Plan) -> bool:
    """A plan holds no request's data: all its inputs are binary (read per request) or in shared memory."""
    return plan.layout is not None or all(type(v) is ShmSlot for v in plan.inputs.values())


def decode_request(body: bytes | memoryview, header_length: int | None, charge: Charge = no_charge) -> InferRequest:
    """Decode an infer request body; header_length is the Inference-Header-Content-Length (None: all JSON).
    `charge` counts what decoding will hold (JSON objects, BYTES strings) before it is allocated."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise InvalidInput(f"Inference-Header-Content-Length {header_length} is outside the body of {len(body)} bytes")
    head = body if header_length is None else body[:header_length]
    cut = jsonplan.split(bytes(body)) if header_length is None and len(body) < FAST_MIN else None
    if cut is not None and (known := jsonplan.decode(cut[0], cut[1], charge)) is not None:
        return known  # a small all-JSON request whose header was checked before: only its numbers are parsed
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    key = (bytes(head), len(binary)) if len(head) <= _PLAN_KEY_MAX else None
    plan = _PLANS.get(key) if key is not None else None
    doc = None
    if plan is None:
        plan, doc = _plan(head, binary, charge)
        if key is not None and _reusable(plan):
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan.layout is not None:  # all inputs binary: views into this body (sizes were checked when the plan was made)
        inputs = {slot.name: binary_tensor(slot, binary, charge) for slot in plan.layout}
    else:  # shared-memory slots (or JSON data): the request's own mapping, the plan's may serve others
        inputs = dict(plan.inputs)
    # the plan's output list and binary map are shared between requests: read-only downstream
    req = InferRequest(
        inputs=inputs,
        outputs=None if plan.outputs is None else list(plan.outputs),
        binary=plan.binary,
        binary_default=plan.binary_default,
        id=plan.id,
        classes=plan.classes,
        params=plan.params,
        shm_out=dict(plan.shm_out),
    )
    if cut is not None and doc is not None:
        jsonplan.learn(cut[0], cut[1], doc, req)
    return req


def _plan(head: bytes | memoryview, binary: memoryview, charge: Charge) -> tuple[Plan, Any]:
    """Parse and check the JSON header (no binary input is read, and BYTES ones are parsed per request)."""
    doc = parse_infer(head, charge, "the request's JSON")
    if not isinstance(doc, dict):
        raise InvalidInput("the request must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    slots: list[BinarySlot] = []
    got: dict[str, np.ndarray | BinarySlot | ShmSlot] = {}
    offset = 0
    for i, spec in enumerate(raw_inputs):
        one = _input(spec, i, binary, offset, charge)
        name = one.name if isinstance(one, BinarySlot) else spec["name"]
        if name in got:
            raise InvalidInput(f"input {name!r} appears twice")
        got[name] = one
        if isinstance(one, BinarySlot):
            slots.append(one)
            offset += one.size
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    all_binary = len(slots) == len(got)
    inputs: dict[str, Any] = {}  # arrays, and ShmSlots the data plane reads when the request runs
    if not all_binary:  # mixed: this plan is not cached, so its binary inputs are read here
        for name, one in got.items():
            inputs[name] = binary_tensor(one, binary, charge) if isinstance(one, BinarySlot) else one
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("'parameters' must be an object")
    check_request(params)
    rid = doc.get("id")
    req = InferRequest(
        inputs={},
        binary_default=bool(params.get("binary_data_output", False)),
        id=rid if isinstance(rid, str) else None,
    )
    _outputs(doc.get("outputs"), req)
    plan = Plan(
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
    return plan, doc
