"""The ONNX graph of the tiny decoder (see tinymodel.py): standard ops only, so every ONNX Runtime provider can run it."""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB = 257  # 256 bytes + <|endoftext|> (agent.generative.tinymodel's tokenizer)
OPSET = 17


class _Graph:
    def __init__(self, rng: np.random.Generator, noise: np.random.Generator, perturb: float) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.rng = rng
        self.noise = noise  # its own stream: the weights stay those of the same seed, noise on top
        self.perturb = perturb
        self.zero: frozenset[str] = frozenset()  # weights made zeros (an idle layer's output projections)
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, base: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, base: str, shape: tuple[int, ...], scale: float) -> str:
        if base in self.zero:
            return self.const(base, np.zeros(shape, np.float32))
        w = self.rng.normal(0.0, scale, size=shape).astype(np.float32)
        if self.perturb:
            w = w + self.noise.normal(0.0, self.perturb * scale, size=shape).astype(np.float32)
        return self.const(base, w)

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def _mask(g: _Graph) -> str:
    """An additive bias [B,1,S,T]: 0 where query i may see key j (j <= past + i and attention_mask[j] == 1), else -1e9."""
    zero, one = g.const("zero", np.array(0, np.int64)), g.const("one", np.array(1, np.int64))
    s = g.op("Gather", [g.op("Shape", ["input_ids"]), one], axis=0)
    t = g.op("Gather", [g.op("Shape", ["attention_mask"]), one], axis=0)
    kidx = g.op("Range", [zero, t, one])
    qidx = g.op("Unsqueeze", [g.op("Range", [g.op("Sub", [t, s]), t, one]), g.const("ax", np.array([1], np.int64))])
    causal = g.op("LessOrEqual", [kidx, qidx])
    pad = g.op("Cast", ["attention_mask"], to=9)
    pad = g.op("Unsqueeze", [pad, g.const("ax", np.array([1, 2], np.int64))])
    allowed = g.op("And", [causal, pad])
    return g.op("Where", [allowed, g.const("z", np.array(0.0, np.float32)), g.const("neg", np.array(-1e9, np.float32))])


def _norm(g: _Graph, x: str, hidden: int) -> str:
    return g.op(
        "LayerNormalization",
        [x, g.const("ln_w", np.ones(hidden, np.float32)), g.const("ln_b", np.zeros(hidden, np.float32))],
        axis=-1,
    )


def _heads(g: _Graph, x: str, w: str, heads: int, hd: int) -> str:
    r = g.op("Reshape", [g.op("MatMul", [x, w]), g.const("shape", np.array([0, 0, heads, hd], np.int64))])
    return g.op("Transpose", [r], perm=[0, 2, 1, 3])


def _layer(g: _Graph, x: str, bias: str, i: int, hidden: int, heads: int) -> str:
    hd = hidden // heads
    scale = 1.0 / np.sqrt(hidden)
    h = _norm(g, x, hidden)
    q = _heads(g, h, g.weight("wq", (hidden, hidden), scale), heads, hd)
    k = _heads(g, h, g.weight("wk", (hidden, hidden), scale), heads, hd)
    v = _heads(g, h, g.weight("wv", (hidden, hidden), scale), heads, hd)
    pk = g.op("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
    pv = g.op("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
    scores = g.op("MatMul", [q, g.op("Transpose", [pk], perm=[0, 1, 3, 2])])
    scores = g.op("Add", [g.op("Mul", [scores, g.const("sc", np.array(1.0 / np.sqrt(hd), np.float32))]), bias])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), pv])
    ctx = g.op(
        "Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const("shape", np.array([0, 0, hidden], np.int64))]
    )
    x = g.op("Add", [x, g.op("MatMul", [ctx, g.weight("wo", (hidden, hidden), scale)])])
    up = g.op("Relu", [g.op("MatMul", [_norm(g, x, hidden), g.weight("w1", (hidden, 4 * hidden), scale)])])
    return g.op("Add", [x, g.op("MatMul", [up, g.weight("w2", (4 * hidden, hidden), 0.5 * scale)])])


def _gqa_inputs(g: _Graph) -> tuple[str, str]:
    """(seqlens_k, total_sequence_length) for GroupQueryAttention, from the 2-D attention mask (as the runtime's
    model builder makes them): each row's token count - 1 (int32), and the mask's length (int32)."""
    one = g.const("one", np.array([1], np.int64))
    seqlens = g.op("Cast", [g.op("Sub", [g.op("ReduceSum", ["attention_mask", one], keepdims=0), one])], to=6)
    total = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const("i1", np.array(1, np.int64))], axis=0)
    return seqlens, g.op("Cast", [total], to=6)


def _layer_gqa(g: _Graph, x: str, mask: tuple[str, str], i: int, hidden: int, heads: int) -> str:
    """The block of _layer (the same weights, drawn in the same order) through com.microsoft GroupQueryAttention,
    whose past and present share one buffer of max_length (past_present_share_buffer)."""
    from onnx import helper

    scale = 1.0 / np.sqrt(hidden)
    h = _norm(g, x, hidden)
    q, k, v = (g.op("MatMul", [h, g.weight(w, (hidden, hidden), scale)]) for w in ("wq", "wk", "wv"))
    out = g.name("gqa")
    past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    node = helper.make_node(
        "GroupQueryAttention",
        [q, k, v, *past, *mask],
        [out, f"present.{i}.key", f"present.{i}.value"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=heads,
    )
    g.nodes.append(node)
    x = g.op("Add", [x, g.op("MatMul", [out, g.weight("wo", (hidden, hidden), scale)])])
    up = g.op("Relu", [g.op("MatMul", [_norm(g, x, hidden), g.weight("w1", (hidden, 4 * hidden), scale)])])
    return g.op("Add", [x, g.op("MatMul", [up, g.weight("w2", (4 * hidden, hidden), 0.5 * scale)])])


def decoder(t: Any) -> Any:
    """The decoder ModelProto of `t` (tinymodel.Tiny: layers, hidden, heads, max_length, seed, perturb, gqa, idle):
    the same seed gives the same weights, `perturb` adds relative noise on top of them; `gqa`: attention through
    GroupQueryAttention with a shared past/present buffer of max_length; `idle`: that many more layers after them
    whose output projections are zeros (their compute, and the same logits)."""
    from onnx import TensorProto, helper

    layers, hidden, heads, max_length, seed, idle = t.layers, t.hidden, t.heads, t.max_length, t.seed, t.idle
    g = _Graph(np.random.default_rng(seed), np.random.default_rng(seed + 1), t.perturb)
    hd = hidden // heads
    x = g.op(
        "Add",
        [
            g.op("Gather", [g.weight("embed", (VOCAB, hidden), 1.0), "input_ids"]),
            g.op("Gather", [g.weight("pos", (max_length, hidden), 0.5), "position_ids"]),
        ],
    )
    if t.gqa:
        gmask = _gqa_inputs(g)
    else:
        bias = _mask(g)
    for i in range(layers + idle):
        if i == layers:  # the idle layers draw from their own stream: the weights after them stay the seed's
            keep = g.rng, g.perturb
            g.rng, g.perturb, g.zero = np.random.default_rng(seed + 2), 0.0, frozenset({"wo", "w2"})
        if t.gqa:
            x = _layer_gqa(g, x, gmask, i, hidden, heads)
        else:
            x = _layer(g, x, bias, i, hidden, heads)
    if idle:
        (g.rng, g.perturb), g.zero = keep, frozenset()
    layers += idle
    g.op("MatMul", [_norm(g, x, hidden), g.weight("lm_head", (hidden, VOCAB), 2.0 / np.sqrt(hidden))], "logits")
    kv: list[str | int | None] = ["batch", heads, "past", hd]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])]
    pkv: list[str | int | None] = ["batch", heads, "present", hd]
    for i in range(layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, kv))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, pkv))
    graph = helper.make_graph(g.nodes, "tiny_decoder", inputs, outputs, g.inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("com.microsoft", 1)] if t.gqa else [])
    model = helper.make_model(graph, opset_imports=opsets, producer_name="edge-agent")
    model.ir_version = 8
    return model
