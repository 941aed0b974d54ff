"""The precision a graph was authored in (int8 / fp16 / bf16 / fp32), detected from its ops and weights.

A row's `precision` is the coarsest of the graph's own precision and the one the runtime computed in: an
int8 QDQ graph is `int8` on every provider, an fp16 graph `fp16` on ORT CPU but `bf16` on OpenVINO's bf16
default. The row is judged with the target's tolerance for that label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

# Ops that only appear in quantized graphs (QDQ, QOperator and dynamic-quantization formats, ORT contrib too).
QUANT_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "ConvInteger",
        "MatMulInteger",
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
        "MatMulIntegerToFloat",
    }
)
_ELEM_FP32, _ELEM_FP16, _ELEM_BF16, _ELEM_FP64 = 1, 10, 16, 11
_COARSENESS = {"fp32": 0.0, "fp16": 1.0, "bf16": 1.5, "int8": 2.0}  # bf16 keeps 8 mantissa bits, fp16 11
_RUNTIME_LABEL = {None: "fp32", "f32": "fp32", "fp32": "fp32", "f16": "fp16", "fp16": "fp16", "bf16": "bf16"}


def _walk_graphs(graph: Any) -> Iterator[Any]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk_graphs(attr.g)
            for sub in attr.graphs:
                yield from _walk_graphs(sub)


def is_quant_op(op_type: str) -> bool:
    return op_type in QUANT_OPS or op_type.startswith("QLinear")


def quant_ops(proto: Any) -> list[str]:
    """The quantization op types a model uses (top-level graph, subgraphs and local functions)."""
    found = {n.op_type for g in _walk_graphs(proto.graph) for n in g.node if is_quant_op(n.op_type)}
    found |= {n.op_type for f in proto.functions for n in f.node if is_quant_op(n.op_type)}
    return sorted(found)


def _float_elements(proto: Any) -> Counter[int]:
    """Float weight elements by ONNX element type: initializers and Constant node values."""
    counts: Counter[int] = Counter()
    for g in _walk_graphs(proto.graph):
        tensors = list(g.initializer)
        tensors += [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")]
        for t in tensors:
            if t.data_type in (_ELEM_FP32, _ELEM_FP16, _ELEM_BF16, _ELEM_FP64):
                n = 1
                for d in t.dims:
                    n *= d
                counts[t.data_type] += max(n, 1)
    return counts


def _io_float_types(proto: Any) -> Counter[int]:
    counts: Counter[int] = Counter()
    for vi in list(proto.graph.input) + list(proto.graph.output):
        if vi.type.HasField("tensor_type"):
            et = vi.type.tensor_type.elem_type
            if et in (_ELEM_FP32, _ELEM_FP16, _ELEM_BF16, _ELEM_FP64):
                counts[et] += 1
    return counts


def graph_precision(proto: Any) -> str:
    """int8 when the graph holds quantization ops; else fp16 / bf16 when most float weights (or, without
    weights, the float inputs and outputs) are of that type; else fp32."""
    if quant_ops(proto):
        return "int8"
    counts = _float_elements(proto) or _io_float_types(proto)
    if not counts:
        return "fp32"
    top = max(counts, key=lambda k: counts[k])
    return {_ELEM_FP16: "fp16", _ELEM_BF16: "bf16"}.get(top, "fp32")


def effective(model_precision: str | None, runtime_precision: str | None) -> str | None:
    """The label of a row: the runtime's own label for fp32 graphs (f32, bf16, f16, as reported), else the
    coarser of the graph's and the runtime's precision (int8 stays int8; fp16 on a bf16 runtime is bf16)."""
    if model_precision in (None, "fp32"):
        return runtime_precision
    runtime = _RUNTIME_LABEL.get(runtime_precision, runtime_precision or "fp32")
    if _COARSENESS.get(runtime, 0) > _COARSENESS.get(model_precision, 0):
        return runtime
    return model_precision
