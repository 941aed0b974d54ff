"""Errors that teach: `qualify` of a bare model.onnx whose seeded reference disagrees with every provider says the
reference may not suit this model and points to `edge-agent package` with real inputs (a real model run on
every installed provider through the CLI); with golden data, or any other failure, the reason stays as it was."""

from __future__ import annotations

import json

import onnx
from clirunner import edge_agent
from onnx import TensorProto, helper

from agent.qualify.decision import Row
from agent.qualify.select import no_winner_hint

WHY = "no provider passed compatibility and accuracy"


def _noisy_model(path):
    """y = x + U(0, 1): its outputs differ on every run, so no provider can agree with a reference run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["r"], low=0.0, high=1.0),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "noisy", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_qualify_of_a_bare_model_whose_reference_disagrees_everywhere_points_to_package(tmp_path):
    _noisy_model(tmp_path / "model.onnx")
    r = edge_agent("qualify", "model.onnx", "--budget", "0.5", "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["selected"] is None, doc["reason"]
    failed = [row for row in doc["results"] if row["status"] == "failed"]
    assert failed and all(row["reason"].startswith("accuracy:") for row in failed), doc["results"]
    assert doc["reason"].startswith(WHY) and "the reference may not suit this model" in doc["reason"]
    assert "edge-agent package model.onnx --inputs sample.npy --out my-model" in doc["reason"], doc["reason"]


def test_the_hint_only_where_it_applies():
    acc = Row("cpu", "failed", "accuracy: y: max_rel 0.4 > 0.001 on cpu (f32)")
    refused = Row("openvino", "failed", "session refused: unsupported op")
    assert "may not suit" in no_winner_hint([acc, Row("x", "unavailable", "not installed")], WHY, False, "m.onnx")
    assert no_winner_hint([acc], WHY, True, "m.onnx") == WHY  # golden data: the reference is the user's own
    assert no_winner_hint([acc, refused], WHY, False, "m.onnx") == WHY  # not only accuracy
    assert no_winner_hint([Row("x", "unavailable", "not installed")], WHY, False, "m.onnx") == WHY
