"""save_graph: a generated ONNX graph written as a model file (opset 17, IR 9), as the qualify tests make them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def save_graph(path: Path, nodes: Sequence[Any], name: str, inputs: list, outputs: list, inits: Sequence = ()) -> Path:
    """`path`, written with one graph `name` of `nodes` (inputs, outputs, initializers as onnx.helper makes them)."""
    from onnx import helper

    g = helper.make_graph(list(nodes), name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    path.write_bytes(m.SerializeToString())
    return path
