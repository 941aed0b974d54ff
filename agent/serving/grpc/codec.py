"""KServe v2 gRPC tensors: a ModelInferRequest as the data plane's InferRequest and outputs as a ModelInferResponse
(raw contents read in place; typed contents checked against the shape; shared-memory tensors as ShmSlot/ShmOut)."""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.serving import codec
from agent.serving.binary import binary_blob, parse_bytes, wire_ready
from agent.serving.errors import InvalidInput
from agent.serving.params import check_request, class_count
from agent.serving.proto import oip_pb2 as pb
from agent.serving.shm import ShmSlot, input_slot, output_target

# typed contents field of InferTensorContents by datatype (when raw_input_contents is not used)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _param(p: Any) -> Any:
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def params_of(m: Any) -> dict[str, Any]:
    return {k: _param(v) for k, v in m.items()}


def _input(t: Any, raw: memoryview | None, charge: codec.Charge, params: dict[str, Any]) -> np.ndarray | ShmSlot:
    where = f"input {t.name!r}"
    dtype = codec.numpy_dtype(t.datatype, f"{where}: ")
    if any(d < 0 for d in t.shape) or len(t.shape) > 32:
        raise InvalidInput(f"{where}: 'shape' must be at most 32 non-negative integers, got {list(t.shape)[:40]}")
    shape = tuple(int(d) for d in t.shape)
    count = 1
    for d in shape:
        count *= d
    if count * max(dtype.itemsize, 1) >= 1 << 63:
        raise InvalidInput(f"{where}: shape {list(shape)} describes more than 2^63 bytes")
    if "shared_memory_region" in params:
        return input_slot(t.name, dtype, shape, count, params)
    if raw is not None:
        if t.datatype == "BYTES":
            return parse_bytes(t.name, raw, count, charge).reshape(shape)
        if len(raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"{where}: raw contents of {len(raw)} bytes != {count} elements x {dtype.itemsize} bytes of "
                f"{t.datatype} for shape {list(shape)}"
            )
        wire = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
        arr = np.frombuffer(raw, dtype=wire, count=count)
        return (arr.view(np.uint8) != 0 if dtype == np.bool_ else arr).reshape(shape)
    field = _CONTENTS.get(t.datatype)
    if field is None:
        raise InvalidInput(f"{where}: {t.datatype} has no typed contents field; send raw_input_contents")
    values = getattr(t.contents, field)
    if len(values) != count:
        raise InvalidInput(f"{where}: shape holds {count} elements but contents have {len(values)}")
    if t.datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    try:
        return np.array(values, dtype=dtype).reshape(shape)
    except OverflowError:
        raise InvalidInput(f"{where}: a value is out of range for {t.datatype}") from None


def decode(request: Any, raws: list[memoryview], charge: codec.Charge) -> codec.InferRequest:
    """A ModelInferRequest (without its raw contents) and its raw_input_contents (grpc/raw.parse_request) as the
    data plane's InferRequest; the raw contents are read in place, not copied."""
    params = params_of(request.parameters)
    check_request(params)
    tensor_params = [params_of(t.parameters) for t in request.inputs]
    in_request = sum(1 for p in tensor_params if "shared_memory_region" not in p)
    if raws and len(raws) != in_request:  # raw contents belong to the inputs not in shared memory, in order
        raise InvalidInput(f"{len(raws)} raw_input_contents for {in_request} inputs not in shared memory")
    inputs: dict[str, Any] = {}
    k = 0
    for t, p in zip(request.inputs, tensor_params):
        if t.name in inputs:
            raise InvalidInput(f"input {t.name!r} appears twice")
        raw = None
        if raws and "shared_memory_region" not in p:
            raw, k = raws[k], k + 1
        inputs[t.name] = _input(t, raw, charge, p)
    if not inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    req = codec.InferRequest(inputs=inputs, binary_default=True, id=request.id or None, params=params)
    if request.outputs:
        req.outputs = []
        for o in request.outputs:
            oparams = params_of(o.parameters)
            count = class_count(o.name, oparams)
            if count is not None:
                req.classes[o.name] = count
            target = output_target(o.name, oparams)
            if target is not None:
                req.shm_out[o.name] = target
            req.outputs.append(o.name)
    return req


def encode(name: str, version: str, outputs: dict[str, Any], req: codec.InferRequest) -> tuple[Any, list[Any]]:
    """(the ModelInferResponse without raw contents, its raw_output_contents in order: the arrays themselves where
    their memory is wire bytes, else a copy; grpc/raw.response_bytes joins them)."""
    resp = pb.ModelInferResponse(model_name=name, model_version=version, id=req.id or "")
    contents: list[Any] = []
    for out_name, value in outputs.items():
        arr = codec.carriable(out_name, value)
        datatype = codec.datatype_of(arr.dtype)
        tensor = resp.outputs.add(name=out_name, datatype=datatype, shape=list(arr.shape))
        if out_name in req.shm_written:  # in the client's region; an empty raw entry keeps the indices aligned
            tensor.parameters["shared_memory_region"].string_param = req.shm_out[out_name].region
            tensor.parameters["shared_memory_byte_size"].int64_param = req.shm_written[out_name]
            contents.append(b"")
            continue
        contents.append(arr if wire_ready(arr) else binary_blob(arr, datatype))
    return resp, contents
