"""The MLServer REST fixtures that apply to a single ONNX model (SeldonIO/MLServer tests/testdata/: inference-request,
inference-request-with-output, inference-request-invalid-datatype, metadata-server-response and
metadata-model-response), rewritten here as the requests and response shapes they pin (the files are not copied),
against an ONNX model with MLServer's tensor names."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper
from support.serving import _model, call_json, open_session

from agent.serving.http.server import OIPServer
from agent.serving.registry import ModelRegistry

INPUT = {"name": "input-0", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    vi = helper.make_tensor_value_info
    model = _model(
        [helper.make_node("Identity", ["input-0"], ["output-0"])],
        [vi("input-0", TensorProto.INT32, [1, 3])],
        [vi("output-0", TensorProto.INT32, [1, 3])],
    )
    reg = ModelRegistry()
    reg.activate("sum-model", "v1.2.3", open_session(model, tmp_path_factory.mktemp("ml"), "m.onnx"))
    with OIPServer(reg, port=0) as s:
        yield s


def _call(srv, method: str, path: str, doc: dict | None = None) -> tuple[int, dict]:
    return call_json(srv.url + path, doc, method, timeout=30)


def test_inference_request(srv):
    status, doc = _call(srv, "POST", "/v2/models/sum-model/infer", {"inputs": [INPUT]})
    assert status == 200
    assert doc["model_name"] == "sum-model" and doc["model_version"] == "v1.2.3"
    assert doc["outputs"] == [{"name": "output-0", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]
    status, doc = _call(srv, "POST", "/v2/models/sum-model/versions/v1.2.3/infer", {"inputs": [INPUT], "id": "1"})
    assert status == 200 and doc["id"] == "1"


def test_inference_request_with_output(srv):
    doc = {"inputs": [INPUT], "outputs": [{"name": "requested-output-0"}]}
    status, err = _call(srv, "POST", "/v2/models/sum-model/infer", doc)
    assert status == 400 and "requested-output-0" in err["error"]  # MLServer's sum model has it; ours does not
    doc = {"inputs": [INPUT], "outputs": [{"name": "output-0"}]}
    status, out = _call(srv, "POST", "/v2/models/sum-model/infer", doc)
    assert status == 200 and [o["name"] for o in out["outputs"]] == ["output-0"]


def test_inference_request_invalid_datatype(srv):
    bad = {**INPUT, "datatype": "INT322"}
    status, err = _call(srv, "POST", "/v2/models/sum-model/infer", {"inputs": [bad]})
    assert status == 400 and "INT322" in err["error"] and "INT32" in err["error"]


def test_metadata_server_response(srv):
    status, doc = _call(srv, "GET", "/v2")
    assert status == 200
    assert isinstance(doc["name"], str) and isinstance(doc["version"], str) and isinstance(doc["extensions"], list)


def test_metadata_model_response(srv):
    status, doc = _call(srv, "GET", "/v2/models/sum-model")
    assert status == 200
    assert doc["name"] == "sum-model" and doc["versions"] == ["v1.2.3"] and doc["platform"]
    assert doc["inputs"] == [{"name": "input-0", "datatype": "INT32", "shape": [1, 3]}]
    assert doc["outputs"] == [{"name": "output-0", "datatype": "INT32", "shape": [1, 3]}]
