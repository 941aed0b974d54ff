"""Models for the optimisation-variant tests, made in code: a transformer encoder block written out op by op
(multi-head self-attention, LayerNorm as ReduceMean/Sub/Pow/Sqrt/Div, GELU as Erf), as exporters emit it before
any fusion, and a package of it with golden sets from plain onnxruntime CPU. `factored=r` stores each weight
matrix as two factors and multiplies them in the graph, as an export without constant folding leaves a
factored (low-rank, weight-normalised) layer: a session without graph optimisation recomputes every weight on
every run, which offline constant folding removes (`factored_macs` counts the work)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from realmodels import write_meta, write_sets


def _layernorm(nodes: list, inits: list, x: str, tag: str, hidden: int, rng) -> str:
    c = lambda n, v: inits.append(numpy_helper.from_array(np.asarray(v, np.float32), f"{tag}_{n}"))  # noqa: E731
    c("gamma", 1 + 0.1 * rng.standard_normal(hidden))
    c("beta", 0.1 * rng.standard_normal(hidden))
    c("two", 2.0)
    c("eps", 1e-5)
    t = lambda s: f"{tag}_{s}"  # noqa: E731
    nodes += [
        helper.make_node("ReduceMean", [x], [t("mean")], axes=[-1], keepdims=1),
        helper.make_node("Sub", [x, t("mean")], [t("d")]),
        helper.make_node("Pow", [t("d"), t("two")], [t("sq")]),
        helper.make_node("ReduceMean", [t("sq")], [t("var")], axes=[-1], keepdims=1),
        helper.make_node("Add", [t("var"), t("eps")], [t("ve")]),
        helper.make_node("Sqrt", [t("ve")], [t("std")]),
        helper.make_node("Div", [t("d"), t("std")], [t("n")]),
        helper.make_node("Mul", [t("n"), t("gamma")], [t("g")]),
        helper.make_node("Add", [t("g"), t("beta")], [t("out")]),
    ]
    return t("out")


def _weights(inits: list, prelude: list, rng, factored: int):
    """w(name, rows, cols): an initializer, or (factored=r) the MatMul of two initializers [rows, r] @ [r, cols]."""

    def w(name: str, *shape: int) -> None:
        if not factored:
            scaled = rng.standard_normal(shape) / np.sqrt(shape[0])
            inits.append(numpy_helper.from_array(scaled.astype(np.float32), name))
            return
        rows, cols = shape
        a = (rng.standard_normal((rows, factored)) / np.sqrt(rows)).astype(np.float32)
        b = (rng.standard_normal((factored, cols)) / np.sqrt(factored)).astype(np.float32)
        inits.extend([numpy_helper.from_array(a, f"{name}_a"), numpy_helper.from_array(b, f"{name}_b")])
        prelude.append(helper.make_node("MatMul", [f"{name}_a", f"{name}_b"], [name]))

    return w


def factored_macs(hidden: int = 128, ffn: int = 512, factored: int = 512) -> int:
    """Multiply-adds spent per run rebuilding the weights of a factored block (nothing when folded)."""
    return 4 * hidden * factored * hidden + hidden * factored * ffn + ffn * factored * hidden


def block_macs(seq: int = 32, hidden: int = 128, ffn: int = 512) -> int:
    """Multiply-adds of the block itself per run (projections, attention, FFN)."""
    return seq * (4 * hidden * hidden + 2 * hidden * ffn) + 2 * seq * seq * hidden


def transformer_block(
    seq: int = 32, hidden: int = 128, heads: int = 4, ffn: int = 512, seed: int = 0, factored: int = 0
):
    """x [1, seq, hidden] -> y [1, seq, hidden]: y = h + FFN(LN(h)), h = x + MHA(LN(x)); opset 13. With
    `factored=r`, each weight matrix is computed in the graph from two factors (inner dimension r)."""
    rng = np.random.default_rng(seed)
    nodes: list = []
    inits: list = []
    prelude: list = []
    w = _weights(inits, prelude, rng, factored)
    b = lambda n, k: inits.append(numpy_helper.from_array((0.02 * rng.standard_normal(k)).astype(np.float32), n))  # noqa: E731
    const = lambda n, v, dt=np.float32: inits.append(numpy_helper.from_array(np.asarray(v, dt), n))  # noqa: E731
    head = hidden // heads
    const("split_shape", [1, seq, heads, head], np.int64)
    const("merge_shape", [1, seq, hidden], np.int64)
    const("scale", np.sqrt(head))
    const("sqrt2", np.sqrt(2.0))
    const("one", 1.0)
    const("half", 0.5)
    ln1 = _layernorm(nodes, inits, "x", "ln1", hidden, rng)
    for p in ("q", "k", "v"):
        w(f"w{p}", hidden, hidden)
        b(f"b{p}", hidden)
        nodes += [
            helper.make_node("MatMul", [ln1, f"w{p}"], [f"{p}_mm"]),
            helper.make_node("Add", [f"{p}_mm", f"b{p}"], [f"{p}_b"]),
            helper.make_node("Reshape", [f"{p}_b", "split_shape"], [f"{p}_r"]),
            helper.make_node("Transpose", [f"{p}_r"], [f"{p}_t"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3]),
        ]
    w("wo", hidden, hidden)
    b("bo", hidden)
    w("w1", hidden, ffn)
    b("b1", ffn)
    w("w2", ffn, hidden)
    b("b2", hidden)
    nodes += [
        helper.make_node("MatMul", ["q_t", "k_t"], ["qk"]),
        helper.make_node("Div", ["qk", "scale"], ["qk_s"]),
        helper.make_node("Softmax", ["qk_s"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["ctx_m"]),
        helper.make_node("MatMul", ["ctx_m", "wo"], ["o_mm"]),
        helper.make_node("Add", ["o_mm", "bo"], ["o_b"]),
        helper.make_node("Add", ["x", "o_b"], ["h"]),
    ]
    ln2 = _layernorm(nodes, inits, "h", "ln2", hidden, rng)
    nodes += [
        helper.make_node("MatMul", [ln2, "w1"], ["f1_mm"]),
        helper.make_node("Add", ["f1_mm", "b1"], ["f1"]),
        helper.make_node("Div", ["f1", "sqrt2"], ["g_d"]),
        helper.make_node("Erf", ["g_d"], ["g_e"]),
        helper.make_node("Add", ["g_e", "one"], ["g_a"]),
        helper.make_node("Mul", ["f1", "g_a"], ["g_m"]),
        helper.make_node("Mul", ["g_m", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["f2_mm"]),
        helper.make_node("Add", ["f2_mm", "b2"], ["f2"]),
        helper.make_node("Add", ["h", "f2"], ["y"]),
    ]
    graph = helper.make_graph(
        prelude + nodes,
        "encoder_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edge-agent-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def transformer_package(
    root: Path, *, sets: int = 4, seq: int = 32, hidden: int = 128, task: str = "embeddings", factored: int = 0
) -> Path:
    """The block as a package: golden sets from onnxruntime CPU on seeded token embeddings."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "model.onnx"
    onnx.save(transformer_block(seq=seq, hidden=hidden, factored=factored), str(path))
    rng = np.random.default_rng(7)
    write_sets(root, path, [{"x": rng.standard_normal((1, seq, hidden)).astype(np.float32)} for _ in range(sets)])
    write_meta(root, name="encoder-block", version="1", task=task)
    return root
