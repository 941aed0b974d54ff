"""What the Open Inference Protocol can carry: graphs with other inputs or outputs are refused with a remedy,
and a provider whose session or results disagree with the graph's declared datatypes fails its row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.errors import ModelError

ZIPMAP_REMEDY = (
    "convert with options={'zipmap': False} (skl2onnx: to_onnx(model, X, options={'zipmap': False})) "
    "so the probabilities come out as one [N, classes] float tensor"
)
_OTHER_REMEDY = "change the graph so it ends in tensors (e.g. ConcatFromSequence or SequenceAt before the output)"


def type_str(tp: Any) -> str:
    """An ONNX TypeProto as the runtimes write it: tensor(float), seq(map(int64,tensor(float))), ..."""
    from onnx import helper

    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({_elem(helper, tp.tensor_type.elem_type)})"
    if which == "sequence_type":
        return f"seq({type_str(tp.sequence_type.elem_type)})"
    if which == "map_type":
        return f"map({_elem(helper, tp.map_type.key_type)},{type_str(tp.map_type.value_type)})"
    if which == "optional_type":
        return f"optional({type_str(tp.optional_type.elem_type)})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({_elem(helper, tp.sparse_tensor_type.elem_type)})"
    return str(which or "unknown")


def _elem(helper: Any, elem_type: int) -> str:
    try:
        return str(helper.tensor_dtype_to_string(elem_type)).removeprefix("TensorProto.").lower()
    except Exception:  # noqa: BLE001 - an unknown element type number
        return str(elem_type)


def _oip_dtype(elem_type: int) -> str | None:
    """The numpy dtype name OIP carries for an ONNX element type, or None when it has no datatype."""
    from onnx import helper

    from agent.datatypes import DATATYPES

    if elem_type == 16:
        return "bfloat16"
    try:
        name = helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:  # noqa: BLE001 - float8/int4 without a numpy mapping
        return None
    if name.startswith(("str", "bytes")) or name == "object":
        name = "object"
    return name if name in DATATYPES.values() else None


def problems(model_path: str | Path) -> list[str]:
    """One reason per graph input or output that OIP cannot carry, each with its remedy (empty: all servable)."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    producers = {out: n.op_type for n in proto.graph.node for out in n.output}
    inits = {i.name for i in proto.graph.initializer}
    found = []
    for kind, values in (("input", proto.graph.input), ("output", proto.graph.output)):
        for vi in values:
            if vi.name in inits:
                continue
            why = _problem(kind, vi, producers.get(vi.name))
            if why:
                found.append(why)
    return found


def _problem(kind: str, vi: Any, producer: str | None) -> str | None:
    tp = vi.type
    text = type_str(tp)
    if tp.WhichOneof("value") == "tensor_type":
        if _oip_dtype(tp.tensor_type.elem_type) is not None:
            return None
        return (
            f"{kind} {vi.name!r} has type {text}, which has no Open Inference Protocol datatype; "
            f"cast it to a carried type (FP32, FP16, BF16, INT*, UINT*, BOOL, BYTES) in the graph"
        )
    zipmap = producer == "ZipMap" or text.startswith("seq(map(")
    what = " (the output of a ZipMap node)" if producer == "ZipMap" else ""
    return (
        f"{kind} {vi.name!r} has type {text}{what}, which the Open Inference Protocol cannot carry "
        f"(it serves tensors only); {ZIPMAP_REMEDY if zipmap else _OTHER_REMEDY}"
    )


def check_servable(model_path: str | Path) -> None:
    """Raise ModelError naming every input or output OIP cannot carry, with the remedy."""
    found = problems(model_path)
    if found:
        raise ModelError(f"{Path(model_path).name}: refused: {'; '.join(found)}")


def contract_problems(declared: dict[str, list[dict[str, Any]]], sess: Any) -> list[str]:
    """Where a session's inputs or outputs disagree with the graph's declared datatypes (what serving
    would advertise and accept would then differ from the model): e.g. a BF16 input seen as float16."""
    found = []
    for kind, specs in (("input", sess.inputs), ("output", sess.outputs)):
        want = {d["name"]: d["dtype"] for d in declared.get(f"{kind}s", [])}
        for s in specs:
            if s.name in want and s.dtype != want[s.name]:
                found.append(f"{kind} {s.name!r} is {s.dtype} on this provider but {want[s.name]} in the model")
    return found


def result_problems(declared: dict[str, list[dict[str, Any]]], outputs: dict[str, Any]) -> list[str]:
    """Outputs whose values come back in another datatype than the graph declares."""
    import numpy as np

    want = {d["name"]: d["dtype"] for d in declared.get("outputs", [])}
    found = []
    for name, value in outputs.items():
        if name not in want or not isinstance(value, np.ndarray):
            continue
        got = "object" if value.dtype.kind in "OSU" else value.dtype.name
        if got != want[name] and not (got == "object" and want[name] == "object"):
            found.append(f"output {name!r} comes back as {got}, the model declares {want[name]}")
    return found
