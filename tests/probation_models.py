"""Models for the probation and shadow tests, made with onnx.helper (no tests here): a MatMul chain whose cost
is known, the same chain with a redundant equal-cost subgraph (2x the compute, the same outputs), a classifier
and a version of it whose top-1 class differs on a known share of inputs, and a NaN-guarded identity."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
WIDTH = 1024


def _finish(graph) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=OPSET)
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def chain_depth(directory: Path, ms: float, step: int = 16) -> int:
    """The chain_model depth (a multiple of `step`) whose run in a single-threaded cpu session takes about `ms` of
    CPU time or more on this host: a test that needs a 2x compute gap wider than a fixed slack (0.5 ms) sizes its
    model on the host's own speed, not on the machine it was written on. Measured on a depth-16 chain."""
    from agent.providers import get

    path = Path(directory) / "depth-probe.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(chain_model(depth=16), str(path))
    probe = get("cpu").open_session(path, options={"intra_op_num_threads": 1})
    x = {"x": np.ones((1, WIDTH), np.float32)}
    try:
        probe.run(x)
        c0 = time.thread_time()
        for _ in range(5):
            probe.run(x)
        per_layer_ms = (time.thread_time() - c0) / 5 * 1000.0 / 16
    finally:
        probe.close()
    return step * max(1, math.ceil(ms / max(per_layer_ms, 1e-6) / step))


def chain_model(depth: int = 60, redundant: bool = False, bias: float = 0.0) -> onnx.ModelProto:
    """y = tanh(...tanh(x W)... W) + bias over a [1, WIDTH] input, `depth` MatMuls sharing one weight; with
    redundant=True a second chain of the same depth runs beside it and is added times zero (2x the compute)."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    w2 = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)  # no common subexpression
    inits = [
        numpy_helper.from_array(w, "w"),
        *([numpy_helper.from_array(w2, "w2")] if redundant else []),
        numpy_helper.from_array(np.float32(0.0).reshape(()), "zero"),
        numpy_helper.from_array(np.full((WIDTH,), bias, np.float32), "bias"),
    ]
    nodes, last = [], "x"
    for i in range(depth):
        nodes += [helper.make_node("MatMul", [last, "w"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"a{i}"])]
        last = f"a{i}"
    if redundant:
        other = "x"
        for i in range(depth):
            nodes += [
                helper.make_node("MatMul", [other, "w2"], [f"r{i}"]),
                helper.make_node("Tanh", [f"r{i}"], [f"s{i}"]),
            ]
            other = f"s{i}"
        nodes += [helper.make_node("Mul", [other, "zero"], ["dead"]), helper.make_node("Add", [last, "dead"], ["sum"])]
        last = "sum"
    nodes.append(helper.make_node("Add", [last, "bias"], ["y"]))
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "chain", [vi("x", TensorProto.FLOAT, [1, WIDTH])], [vi("y", TensorProto.FLOAT, [1, WIDTH])], inits
    )
    return _finish(graph)


CLASSES, FEATURES = 7, 8


def classifier_weights() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((FEATURES, CLASSES)).astype(np.float32)


def classifier_model(swap: bool = False) -> onnx.ModelProto:
    """scores = x W over [1, FEATURES] -> [1, CLASSES]; swap=True exchanges the columns of classes 0 and 1,
    which changes the top-1 class exactly on the inputs whose top-1 is 0 or 1 (about 2 in 7)."""
    w = classifier_weights()
    if swap:
        w = w[:, [1, 0, *range(2, CLASSES)]]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"])],
        "classifier",
        [vi("x", TensorProto.FLOAT, [1, FEATURES])],
        [vi("scores", TensorProto.FLOAT, [1, CLASSES])],
        [numpy_helper.from_array(w, "w")],
    )
    return _finish(graph)


def classifier_inputs(n: int = 200) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((n, 1, FEATURES)).astype(np.float32)


def disagreement(inputs: np.ndarray) -> float:
    """The share of inputs on which classifier_model(swap=True) changes the top-1 class (numpy, exact)."""
    top = np.argmax(inputs[:, 0, :] @ classifier_weights(), axis=1)
    return float(np.mean(top < 2))


def nan_guard_model() -> onnx.ModelProto:
    """y = Where(IsNaN(x), 0, x) on [1, 4]: finite outputs for NaN inputs (an incumbent that copes)."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("IsNaN", ["x"], ["bad"]), helper.make_node("Where", ["bad", "zero", "x"], ["y"])],
        "guard",
        [vi("x", TensorProto.FLOAT, [1, 4])],
        [vi("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.zeros((1, 4), np.float32), "zero")],
    )
    return _finish(graph)


def string_model() -> onnx.ModelProto:
    """t = Identity(s) on a [1] string tensor (BYTES)."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])],
        "strings",
        [vi("s", TensorProto.STRING, [1])],
        [vi("t", TensorProto.STRING, [1])],
    )
    return _finish(graph)
