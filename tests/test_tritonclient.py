"""Unmodified tritonclient.http against OIPServer: health, metadata, config, binary and JSON infer, errors."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as th
from support.serving import ALL_TYPES, identity_all_types_model, oip_server, open_session
from tritonclient.utils import InferenceServerException

from agent.samples import cnn_model, tiny_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("triton")
    sessions = [
        ("tiny", "4", open_session(tiny_model(4.0), d, "tiny.onnx")),
        ("cnn", "1", open_session(cnn_model(), d, "cnn.onnx")),
        ("ids", "1", open_session(identity_all_types_model(), d, "ids.onnx")),
    ]
    with oip_server(sessions, token="tok") as srv:
        yield srv


def auth() -> dict:
    """A fresh dict per call: tritonclient writes Inference-Header-Content-Length into the caller's headers."""
    return {"Authorization": "Bearer tok"}


@pytest.fixture(scope="module")
def client(server):
    c = th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)
    yield c
    c.close()


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny", headers=auth())
    assert client.is_model_ready("tiny", model_version="4", headers=auth())
    assert not client.is_model_ready("tiny", model_version="5", headers=auth())
    assert not client.is_model_ready("nope", headers=auth())
    assert client.get_server_metadata(headers=auth())["name"] == "edge-agent"
    meta = client.get_model_metadata("cnn", headers=auth())
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}
    cfg = client.get_model_config("cnn", headers=auth())
    assert cfg["max_batch_size"] == 0 and cfg["input"][0]["data_type"] == "TYPE_FP32"


def _np(datatype, n=5):
    rng = np.random.default_rng(1)
    if datatype == "BYTES":
        return np.array([f"s{i}é".encode() for i in range(n)], dtype=np.object_)
    if datatype == "BOOL":
        return rng.integers(0, 2, n).astype(bool)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype)
    if dtype is not None:
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(0, 100, n).astype(datatype.lower())


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_every_datatype(client, binary):
    inputs = []
    for t in ALL_TYPES:
        i = th.InferInput(f"in_{t}", [5], t)
        i.set_data_from_numpy(_np(t), binary_data=binary)
        inputs.append(i)
    outputs = [th.InferRequestedOutput(f"out_{t}", binary_data=binary) for t in ALL_TYPES]
    result = client.infer("ids", inputs, outputs=outputs, headers=auth())
    assert result.get_response()["model_version"] == "1"
    for t in ALL_TYPES:
        got, want = result.as_numpy(f"out_{t}"), _np(t)
        if t == "BYTES":
            assert [g if isinstance(g, bytes) else g.encode() for g in got] == list(want)
        else:
            np.testing.assert_array_equal(got, want, err_msg=t)


def test_infer_cnn_binary_default(client):
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    i = th.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    r = client.infer("cnn", [i], model_version="1", headers=auth(), request_id="req-7")
    probs = r.as_numpy("probabilities")
    assert probs.shape == (2, 10) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert r.get_response()["id"] == "req-7"


def _tiny_input(shape=(1, 4), dtype="FP32", name="x"):
    i = th.InferInput(name, list(shape), dtype)
    i.set_data_from_numpy(np.ones(shape, dtype=np.float64 if dtype == "FP64" else np.float32))
    return i


@pytest.mark.parametrize(
    "kwargs, status, fragment",
    [
        ({"model_name": "nope"}, "404", "not loaded"),
        ({"model_name": "tiny", "model_version": "9"}, "404", "version 9"),
        ({"model_name": "tiny", "inputs": [_tiny_input(name="z")]}, "400", "unknown input"),
        ({"model_name": "tiny", "inputs": [_tiny_input(shape=(2, 4))]}, "400", "shape [2, 4]"),
        ({"model_name": "tiny", "inputs": [_tiny_input(dtype="FP64")]}, "400", "datatype FP64"),
        ({"model_name": "tiny", "headers": {}}, "401", "bearer token"),
    ],
)
def test_errors_raise_inference_server_exception(client, kwargs, status, fragment):
    kwargs = {"inputs": [_tiny_input()], "headers": auth(), **kwargs}
    with pytest.raises(InferenceServerException) as info:
        client.infer(**kwargs)
    assert info.value.status() == status and fragment in info.value.message()
    assert client.infer("tiny", [_tiny_input()], headers=auth()).as_numpy("y")[0, 0] == 5.0
