"""BF16 tensors end to end: onnxruntime's Python API has no numpy bfloat16, the server still serves such models."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
import tritonclient.http as th
from onnx import TensorProto
from support.serving import call_json, cast_model, oip_server

from agent.providers import get


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16")
    sessions = []
    for name, src, dst in (
        ("bf16-in", TensorProto.BFLOAT16, TensorProto.FLOAT),
        ("bf16-out", TensorProto.FLOAT, TensorProto.BFLOAT16),
    ):
        onnx.save(cast_model(src, dst), d / f"{name}.onnx")
        sessions.append((name, "1", get("cpu").open_session(d / f"{name}.onnx")))
    with oip_server(sessions) as srv:
        yield srv


def post(srv, model: str, doc: dict) -> tuple[int, dict]:
    return call_json(f"{srv.url}/v2/models/{model}/infer", doc)


def test_bf16_input_and_output_in_json(server):
    status, doc = post(
        server, "bf16-in", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "BF16", "data": [1.5, -2.0, 3.0]}]}
    )
    assert status == 200, doc
    assert doc["outputs"][0]["datatype"] == "FP32" and doc["outputs"][0]["data"] == [1.5, -2.0, 3.0]
    status, doc = post(
        server, "bf16-out", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.5, 0.1, 3.0]}]}
    )
    assert status == 200, doc
    out = doc["outputs"][0]
    assert out["datatype"] == "BF16"
    assert out["data"] == [1.5, float(np.float32(ml_dtypes.bfloat16(0.1))), 3.0]  # rounded to 8 mantissa bits


def test_bf16_output_binary_through_tritonclient(server):
    client = th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)
    try:
        x = th.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(np.array([[1.5, 2.25, -4.0]], np.float32))
        y = client.infer("bf16-out", [x]).as_numpy("y")
        assert np.asarray(y, dtype=np.float32).tolist() == [[1.5, 2.25, -4.0]]
    finally:
        client.close()


def test_wrong_dtype_for_a_bf16_input_is_a_400(server):
    status, doc = post(
        server, "bf16-in", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    )
    assert status == 400 and "model's BF16" in doc["error"]
