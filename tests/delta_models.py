"""Models for the delta-pull tests, made in code: an fp32 MLP and the same model with one weight tensor changed."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(layers: int, width: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"h{i}"]),
        ]
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def finetune(model: onnx.ModelProto, tensor: str, seed: int = 1) -> tuple[onnx.ModelProto, int]:
    """(the model with `tensor` nudged, the bytes of that tensor's data)."""
    m = copy.deepcopy(model)
    for i, init in enumerate(m.graph.initializer):
        if init.name == tensor:
            arr = numpy_helper.to_array(init)
            arr = (arr + np.random.default_rng(seed).standard_normal(arr.shape) * 1e-3).astype(np.float32)
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, tensor))
            return m, arr.nbytes
    raise KeyError(tensor)


def versions(tmp, layers: int = 8, width: int = 512) -> tuple:
    """(v1 path, v2 path, changed bytes): v2 differs from v1 in one weight tensor."""
    v1 = mlp(layers, width)
    v2, changed = finetune(v1, f"w{layers // 2}")
    onnx.save(v1, tmp / "v1.onnx")
    onnx.save(v2, tmp / "v2.onnx")
    return tmp / "v1.onnx", tmp / "v2.onnx", changed
