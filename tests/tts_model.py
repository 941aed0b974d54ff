"""A text-to-speech-like ONNX model made in code (issue 42): int64 `tokens` [1, n], `style` [1, 256], `speed` [1]
-> `audio` [samples]. A chain of `layers` attention-like blocks over the tokens (an [n, n] score MatMul each: the
cost of a run grows with n^2), then per-token durations from the context; the audio length is the sum of the
durations over `speed` (Ceil) times HOP samples: it depends on the token values, not only their count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from support.onnxfile import save_graph

HOP = 64  # samples per frame
VOCAB = 178  # token ids a text front end emits: [3, VOCAB)


def tts_model(path: Path, *, dim: int = 64, layers: int = 4, chain: int = 0, seed: int = 0) -> Path:
    """`chain`: that many [n, n] @ [n, n] MatMuls on the first block's scores (a cost growing with n^3)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(w(VOCAB, dim), "embed"),
        numpy_helper.from_array(w(256, dim), "style_proj"),
        numpy_helper.from_array(w(dim, 1), "dur_proj"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array(1.0, np.float32), "onef"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zerof"),
        numpy_helper.from_array(np.array(float(HOP), np.float32), "hop"),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(dim), np.float32), "scale"),
        numpy_helper.from_array(np.array(0.05, np.float32), "freq"),
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "tokens"], ["e3"]),  # [1, n, dim]
        helper.make_node("Squeeze", ["e3", "axis0"], ["e"]),  # [n, dim]
        helper.make_node("MatMul", ["style", "style_proj"], ["s"]),  # [1, dim]
        helper.make_node("Add", ["e", "s"], ["h0"]),
    ]
    h = "h0"
    for i in range(layers):
        nodes += [
            helper.make_node("Transpose", [h], [f"ht{i}"], perm=[1, 0]),
            helper.make_node("MatMul", [h, f"ht{i}"], [f"sc{i}"]),  # [n, n]
            helper.make_node("Mul", [f"sc{i}", "scale"], [f"ss{i}" if i or not chain else "q0"]),
            helper.make_node("Softmax", [f"ss{i}"], [f"p{i}"], axis=-1),
            helper.make_node("MatMul", [f"p{i}", h], [f"c{i}"]),  # [n, dim]
            helper.make_node("Add", [h, f"c{i}"], [f"r{i}"]),
            helper.make_node("Tanh", [f"r{i}"], [f"h{i + 1}"]),
        ]
        h = f"h{i + 1}"
        if i == 0 and chain:  # spliced in before block 0's Softmax: q0 -> ... -> ss0
            cubic = []
            for j in range(chain):
                cubic += [
                    helper.make_node("MatMul", [f"q{j}", f"q{j}"], [f"qq{j}"]),
                    helper.make_node("Tanh", [f"qq{j}"], [f"q{j + 1}" if j + 1 < chain else "ss0"]),
                ]
            nodes[7:7] = cubic  # after block 0's Transpose, MatMul, Mul
    nodes += [
        helper.make_node("MatMul", [h, "dur_proj"], ["d0"]),  # [n, 1]
        helper.make_node("Sigmoid", ["d0"], ["d1"]),
        helper.make_node("Add", ["d1", "onef"], ["dur"]),  # 1..2 frames a token
        helper.make_node("ReduceSum", ["dur"], ["total"], keepdims=0),
        helper.make_node("Div", ["total", "speed"], ["frames_f"]),  # [1]
        helper.make_node("Ceil", ["frames_f"], ["frames_c"]),
        helper.make_node("Mul", ["frames_c", "hop"], ["n_samples"]),
        helper.make_node("Squeeze", ["n_samples", "axis0"], ["limit"]),
        helper.make_node("Range", ["zerof", "limit", "onef"], ["t"]),  # [samples]
        helper.make_node("ReduceMean", [h], ["level"], keepdims=0),
        helper.make_node("Mul", ["t", "freq"], ["phase0"]),
        helper.make_node("Add", ["phase0", "level"], ["phase"]),
        helper.make_node("Sin", ["phase"], ["audio"]),
    ]
    inputs = [
        helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "n"]),
        helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, 256]),
        helper.make_tensor_value_info("speed", TensorProto.FLOAT, [1]),
    ]
    audio = helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["samples"])
    return save_graph(path, nodes, "tts", inputs, [audio], inits)


def tts_inputs(directory: Path, n: int = 56, sets: int = 2) -> list[Path]:
    """Golden samples as .npz (named members): token ids of "real text" in [3, VOCAB), a style vector, speed 1."""
    rng = np.random.default_rng(11)
    files = []
    for i in range(sets):
        files.append(directory / f"utt{i}.npz")
        np.savez(
            files[-1],
            tokens=rng.integers(3, VOCAB, (1, n)).astype(np.int64),
            style=(rng.standard_normal((1, 256)) * 0.1).astype(np.float32),
            speed=np.array([1.0], np.float32),
        )
    return files
