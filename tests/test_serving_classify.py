"""Classification extension: top-K classes per batch row as "value:index[:label]", labels from the package's
labels.txt (agent/package/labels.py), on HTTP; bad class counts are 400s."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper
from support.serving import _model, call_json, open_session

from agent.package.labels import read_labels
from agent.serving.dataplane import classify
from agent.serving.errors import InvalidInput
from agent.serving.http.server import OIPServer
from agent.serving.registry import ModelRegistry


def test_classify_rows_and_labels():
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.1, 0.4]], dtype=np.float32)
    out = classify(scores, 2, ["cat", "dog", "eel"])
    assert [[s.decode() for s in row] for row in out] == [
        ["0.700000:1:dog", "0.200000:2:eel"],
        ["0.500000:0:cat", "0.400000:2:eel"],
    ]
    assert [s.decode() for s in classify(np.array([3, 9, 1], dtype=np.int64), 5, None)] == [
        "9.000000:1",
        "3.000000:0",
        "1.000000:2",
    ]
    with pytest.raises(InvalidInput):
        classify(scores, 0, None)


def test_labels_file(tmp_path):
    assert read_labels(tmp_path) is None
    (tmp_path / "labels.txt").write_text("cat\ndog\r\neel\n")
    assert read_labels(tmp_path) == ["cat", "dog", "eel"]
    (tmp_path / "labels.txt").write_bytes(b"\xff\xfe")
    assert read_labels(tmp_path) is None  # not UTF-8: no labels, never a failed deployment


def test_classification_over_http_uses_the_model_labels(tmp_path):
    vi = helper.make_tensor_value_info
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, ["n", 3])],
        [vi("y", TensorProto.FLOAT, ["n", 3])],
    )
    reg = ModelRegistry()
    reg.activate("cls", "1", open_session(model, tmp_path, "cls.onnx"), {"_labels": ["cat", "dog", "eel"]})
    with OIPServer(reg, port=0) as srv:

        def post(doc):
            return call_json(f"{srv.url}/v2/models/cls/infer", doc, timeout=30)

        x = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0.2, 0.9, 0.1]}
        status, doc = post({"inputs": [x], "outputs": [{"name": "y", "parameters": {"classification": 2}}]})
        assert status == 200
        out = doc["outputs"][0]
        assert out["datatype"] == "BYTES" and out["shape"] == [1, 2]
        assert out["data"] == ["0.900000:1:dog", "0.200000:0:cat"]
        status, doc = post({"inputs": [x], "outputs": [{"name": "y", "parameters": {"classification": -1}}]})
        assert status == 400 and "classification" in doc["error"]
        meta = json.loads(urllib.request.urlopen(f"{srv.url}/v2/models/cls", timeout=30).read())
        assert "_labels" not in meta.get("parameters", {})
