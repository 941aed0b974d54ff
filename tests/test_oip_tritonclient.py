"""Every tritonclient.http and tritonclient.grpc call against the daemon (an in-process DeviceAgent with a token and
two deployed versions of one model): each works with Triton's semantics, or is refused with a clear 4xx / gRPC status
(CUDA shared memory, trace and logging: docs/serving.md). Unmodified clients; real sockets, real sessions."""

from __future__ import annotations

import gzip
import json
import queue
import urllib.error
import urllib.request
import zlib
from multiprocessing import shared_memory

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support.agent import make_agent
from support.daemon import deploy
from tritonclient.utils import InferenceServerException

TOKEN = "a-long-enough-serving-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def auth() -> dict:
    return dict(AUTH)  # a fresh dict per call: tritonclient.http adds Inference-Header-Content-Length to the one given


def gauth() -> dict:
    return {"authorization": f"Bearer {TOKEN}"}


X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tc")
    (tmp / "token").write_text(TOKEN + "\n")
    serving = {"host": "127.0.0.1", "port": 0, "token_file": str(tmp / "token"), "shadow": {"duration_s": 1.0}}
    a = make_agent(tmp, extra={"serving": serving})
    a.start()
    try:
        assert deploy(a, "1").state.value == "committed"
        assert deploy(a, "2").state.value == "committed"  # v1 is now the previous slot
        yield a
    finally:
        a.stop()


@pytest.fixture
def http(agent):
    c = th.InferenceServerClient(agent.url.removeprefix("http://"))
    yield c
    c.close()


@pytest.fixture
def grpc_client(agent):
    c = tg.InferenceServerClient(agent.grpc_server.target)
    yield c
    c.close()


def _refused(call, status: str) -> str:
    with pytest.raises(InferenceServerException) as exc:
        call()
    assert str(exc.value.status()) == status, (exc.value.status(), exc.value.message())
    return exc.value.message()


def _region(name: str, size: int) -> shared_memory.SharedMemory:
    try:
        shared_memory.SharedMemory(name).unlink()
    except FileNotFoundError:
        pass
    return shared_memory.SharedMemory(name, create=True, size=size)


# ---- HTTP --------------------------------------------------------------------------------------------------------


def test_http_health_metadata_config(http):
    assert http.is_server_live() and http.is_server_ready()
    assert http.is_model_ready("tiny", headers=auth()) and http.is_model_ready("tiny", "2", headers=auth())
    meta = http.get_server_metadata(headers=auth())
    assert meta["name"] == "edge-agent"
    assert set(meta["extensions"]) == {
        "binary_tensor_data",
        "model_configuration",
        "statistics",
        "classification",
        "system_shared_memory",
        "model_repository",
    }
    m = http.get_model_metadata("tiny", headers=auth())
    assert m["versions"] == ["2"] and m["inputs"][0]["name"] == "x" and m["outputs"][0]["datatype"] == "FP32"
    cfg = http.get_model_config("tiny", headers=auth())
    assert cfg["input"][0]["data_type"] == "TYPE_FP32" and cfg["max_batch_size"] == 0
    assert "token" in _refused(lambda: http.get_server_metadata(), "401")  # no token: 401


def test_http_infer_binary_json_compressed_async_classification(http):
    x = th.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)  # binary by default
    r = http.infer("tiny", [x], headers=auth())
    np.testing.assert_allclose(r.as_numpy("y"), X + 2)
    assert r.get_response()["model_version"] == "2"
    xj = th.InferInput("x", [1, 4], "FP32")
    xj.set_data_from_numpy(X, binary_data=False)
    r = http.infer("tiny", [xj], outputs=[th.InferRequestedOutput("y", binary_data=False)], headers=auth())
    assert r.get_response()["outputs"][0]["data"] == (X + 2).ravel().tolist()
    for algo in ("gzip", "deflate"):
        r = http.infer(
            "tiny",
            [x],
            headers=auth(),
            request_compression_algorithm=algo,
            response_compression_algorithm=algo,
            outputs=[th.InferRequestedOutput("y", binary_data=False)],
            request_id=LONG_ID,  # a response over 1 KiB: the server compresses it, tritonclient decodes it
        )
        assert r.get_response()["outputs"][0]["data"] == (X + 2).ravel().tolist()
        assert r.get_response()["id"] == LONG_ID
    r = http.async_infer("tiny", [x], headers=auth(), request_id="abc").get_result()
    assert r.get_response()["id"] == "abc"
    top = http.infer("tiny", [x], outputs=[th.InferRequestedOutput("y", class_count=2)], headers=auth())
    assert [s.decode() for s in top.as_numpy("y").ravel()] == ["6.000000:3", "5.000000:2"]
    msg = _refused(
        lambda: http.infer("tiny", [x], headers=auth(), sequence_id=7, sequence_start=True), "400"
    )  # a stateless model: sequences are refused, not ignored
    assert "sequence" in msg
    r = http.infer("tiny", [x], headers=auth(), priority=1, timeout=1000)  # honoured (one queue, never queued)
    np.testing.assert_allclose(r.as_numpy("y"), X + 2)


def test_http_raw_binary_request(agent):
    req = urllib.request.Request(
        f"{agent.url}/v2/models/tiny/infer",
        data=X.tobytes(),
        method="POST",
        headers={**auth(), "Inference-Header-Content-Length": "0"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
        hlen = int(resp.headers["Inference-Header-Content-Length"])
    doc = json.loads(raw[:hlen])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 16
    np.testing.assert_allclose(np.frombuffer(raw[hlen:], "<f4").reshape(1, 4), X + 2)


LONG_ID = "request-" + "0123456789" * 150  # echoed in the response: 1.5 KB, over the 1 KiB compression floor


@pytest.mark.parametrize("algo", ["gzip", "deflate"])
def test_http_response_is_compressed_when_accepted(agent, algo):
    """A response of 1 KiB or more goes out encoded as the client accepts (docs/serving.md): what arrives is
    compressed (smaller, and decodes only as `algo`), and decoding it gives the inference; one under 1 KiB does not."""
    body = json.dumps(
        {"id": LONG_ID, "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
    ).encode()
    headers = {**auth(), "Content-Type": "application/json", "Accept-Encoding": algo}
    req = urllib.request.Request(f"{agent.url}/v2/models/tiny/infer", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:  # urllib leaves the body as it came
        assert resp.headers.get("Content-Encoding") == algo, dict(resp.headers)
        raw = resp.read()
    assert len(raw) < len(LONG_ID)  # compressed: the id alone is longer than what arrived
    doc = json.loads(gzip.decompress(raw) if algo == "gzip" else zlib.decompress(raw))
    assert doc["id"] == LONG_ID and doc["model_version"] == "2"
    assert doc["outputs"][0]["data"] == (X + 2).ravel().tolist()
    small = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    req = urllib.request.Request(
        f"{agent.url}/v2/models/tiny/infer", data=small.encode(), method="POST", headers=headers
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers.get("Content-Encoding") is None  # under 1 KiB: as it is
        assert json.loads(resp.read())["outputs"][0]["data"] == [3.0, 4.0, 5.0, 6.0]


def test_http_statistics_in_triton_shape(http):
    x = th.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    http.infer("tiny", [x], headers=auth())
    stats = http.get_inference_statistics("tiny", headers=auth())["model_stats"][0]
    assert stats["name"] == "tiny" and stats["version"] == "2"
    assert stats["inference_count"] >= 1 and stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_stats"]["success"]["ns"] > 0 and stats["last_inference"] > 0
    assert {"queue", "compute_input", "compute_infer", "compute_output"} <= set(stats["inference_stats"])
    every = http.get_inference_statistics(headers=auth())["model_stats"]
    assert [s["name"] for s in every] == ["tiny"]
    _refused(lambda: http.get_inference_statistics("nope", headers=auth()), "404")


def test_http_system_shared_memory(http):
    inp, out = _region("ea_tc_in", 64), _region("ea_tc_out", 16)
    try:
        np.ndarray((1, 4), np.float32, inp.buf, offset=32)[:] = X
        http.register_system_shared_memory("in", "/ea_tc_in", 48, offset=16, headers=auth())
        http.register_system_shared_memory("out", "/ea_tc_out", 16, headers=auth())
        status = {r["name"]: r for r in http.get_system_shared_memory_status(headers=auth())}
        assert status["in"] == {"name": "in", "key": "/ea_tc_in", "offset": 16, "byte_size": 48}
        x = th.InferInput("x", [1, 4], "FP32")
        x.set_shared_memory("in", 16, offset=16)  # region offset 16 + 16: byte 32 of the memory
        y = th.InferRequestedOutput("y", binary_data=True)
        y.set_shared_memory("out", 16)
        r = http.infer("tiny", [x], outputs=[y], headers=auth())
        assert r.get_output("y")["parameters"]["shared_memory_byte_size"] == 16
        np.testing.assert_allclose(np.ndarray((1, 4), np.float32, out.buf), X + 2)
        bad = th.InferInput("x", [1, 4], "FP32")
        bad.set_shared_memory("in", 16, offset=40)  # 40 + 16 > 48
        assert "run past region" in _refused(lambda: http.infer("tiny", [bad], headers=auth()), "400")
        _refused(lambda: http.register_system_shared_memory("in", "/ea_tc_in", 8, headers=auth()), "409")
        _refused(lambda: http.register_system_shared_memory("big", "/ea_tc_in", 65, headers=auth()), "400")
        _refused(lambda: http.register_system_shared_memory("x", "/ea_tc_absent", 8, headers=auth()), "400")
        http.unregister_system_shared_memory("in", headers=auth())
        assert [r["name"] for r in http.get_system_shared_memory_status(headers=auth())] == ["out"]
        http.unregister_system_shared_memory(headers=auth())
        assert http.get_system_shared_memory_status(headers=auth()) == []
        inp.buf[:4] = b"live"  # the server never freed or unlinked the client's memory
        assert bytes(inp.buf[:4]) == b"live"
    finally:
        for r in (inp, out):
            r.close()
            r.unlink()


def test_http_unsupported_extensions_are_clear_400s(http):
    for call in (
        lambda: http.get_cuda_shared_memory_status(headers=auth()),
        lambda: http.register_cuda_shared_memory("c", b"\0" * 64, 0, 16, headers=auth()),
        lambda: http.unregister_cuda_shared_memory(headers=auth()),
        lambda: http.get_trace_settings(headers=auth()),
        lambda: http.get_log_settings(headers=auth()),
        lambda: http.update_log_settings({"log_info": True}, headers=auth()),
    ):
        assert "not supported" in _refused(call, "400")
    try:  # tritonclient itself raises TypeError before sending on some versions (docs/serving.md)
        msg = _refused(
            lambda: http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, headers=auth()), "400"
        )
        assert "not supported" in msg
    except TypeError:
        pass


# ---- repository (shared by both transports: one slot table) ----------------------------------------------------


def test_repository_index_unload_load_over_http_and_grpc(agent, http, grpc_client):
    index = http.get_model_repository_index(headers=auth())
    assert index == [{"name": "tiny", "version": "2", "state": "READY", "reason": ""}]
    _refused(lambda: http.unload_model("tiny"), "401")  # needs the token
    http.unload_model("tiny", headers=auth())
    assert not http.is_model_ready("tiny", headers=auth())
    assert http.get_model_repository_index(headers=auth())[0]["state"] == "UNAVAILABLE"
    g_index = grpc_client.get_model_repository_index(headers=gauth(), as_json=True)
    assert g_index["models"][0]["reason"] == "unloaded"
    grpc_client.load_model("tiny", headers=gauth())
    assert grpc_client.is_model_ready("tiny", headers=gauth())
    assert "config" in _refused(lambda: http.load_model("tiny", headers=auth(), config="{}"), "400")
    grpc_client.unload_model("tiny", headers=gauth())
    assert not grpc_client.is_model_ready("tiny", headers=gauth())
    http.load_model("tiny", headers=auth())
    x = th.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    np.testing.assert_allclose(http.infer("tiny", [x], headers=auth()).as_numpy("y"), X + 2)
    _refused(lambda: http.unload_model("nope", headers=auth()), "404")
    req = urllib.request.Request(  # parameters.version names the other slot: a journaled rollback
        f"{agent.url}/v2/repository/models/tiny/load",
        data=json.dumps({"parameters": {"version": "9"}}).encode(),
        method="POST",
        headers=auth(),
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30)
    assert exc.value.code == 400 and "no version '9'" in json.loads(exc.value.read())["error"]


# ---- gRPC --------------------------------------------------------------------------------------------------------


def test_grpc_health_metadata_config_statistics(grpc_client):
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("tiny", headers=gauth())
    meta = grpc_client.get_server_metadata(headers=gauth(), as_json=True)
    assert "model_repository" in meta["extensions"] and "system_shared_memory" in meta["extensions"]
    m = grpc_client.get_model_metadata("tiny", headers=gauth(), as_json=True)
    assert m["inputs"][0]["shape"] == ["1", "4"] and m["versions"] == ["2"]
    cfg = grpc_client.get_model_config("tiny", headers=gauth(), as_json=True)["config"]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    stats = grpc_client.get_inference_statistics("tiny", headers=gauth(), as_json=True)["model_stats"][0]
    # proto3 JSON leaves out fields at their default: a model nothing has run on yet has no inference_count
    before = int(stats.get("inference_count", 0))
    x = tg.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    grpc_client.infer("tiny", [x], headers=gauth())
    stats = grpc_client.get_inference_statistics("tiny", headers=gauth(), as_json=True)["model_stats"][0]
    assert stats["name"] == "tiny" and stats["version"] == "2"
    assert int(stats["inference_count"]) == before + 1, stats  # this module's tests run one at a time
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    _refused(lambda: grpc_client.get_server_metadata(), "StatusCode.UNAUTHENTICATED")
    _refused(lambda: grpc_client.get_model_metadata("nope", headers=gauth()), "StatusCode.NOT_FOUND")


def test_grpc_infer_async_stream_classification(grpc_client):
    x = tg.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    r = grpc_client.infer("tiny", [x], headers=gauth(), request_id="r1")
    np.testing.assert_allclose(r.as_numpy("y"), X + 2)
    assert r.get_response().id == "r1"
    got: queue.Queue = queue.Queue()
    grpc_client.async_infer("tiny", [x], lambda result, error: got.put((result, error)), headers=gauth())
    result, error = got.get(timeout=30)
    assert error is None and np.allclose(result.as_numpy("y"), X + 2)
    grpc_client.start_stream(lambda result, error: got.put((result, error)), headers=gauth())
    for _ in range(3):
        grpc_client.async_stream_infer("tiny", [x])
    grpc_client.async_stream_infer("nope", [x])  # an error travels on the stream; the stream goes on
    grpc_client.async_stream_infer("tiny", [x])
    results = [got.get(timeout=30) for _ in range(5)]
    grpc_client.stop_stream()
    assert sum(1 for r, e in results if e is None and np.allclose(r.as_numpy("y"), X + 2)) == 4
    assert sum(1 for r, e in results if e is not None) == 1
    top = grpc_client.infer("tiny", [x], outputs=[tg.InferRequestedOutput("y", class_count=1)], headers=gauth())
    assert [s.decode() for s in top.as_numpy("y").ravel()] == ["6.000000:3"]
    bad = tg.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(X[:, :3])
    _refused(lambda: grpc_client.infer("tiny", [bad], headers=gauth()), "StatusCode.INVALID_ARGUMENT")


def test_grpc_system_shared_memory_and_unsupported(grpc_client):
    inp, out = _region("ea_tg_in", 16), _region("ea_tg_out", 16)
    try:
        np.ndarray((1, 4), np.float32, inp.buf)[:] = X
        grpc_client.register_system_shared_memory("in", "/ea_tg_in", 16, headers=gauth())
        grpc_client.register_system_shared_memory("out", "/ea_tg_out", 16, headers=gauth())
        status = grpc_client.get_system_shared_memory_status(headers=gauth(), as_json=True)
        assert set(status["regions"]) == {"in", "out"}
        x = tg.InferInput("x", [1, 4], "FP32")
        x.set_shared_memory("in", 16)
        y = tg.InferRequestedOutput("y")
        y.set_shared_memory("out", 16)
        grpc_client.infer("tiny", [x], outputs=[y], headers=gauth())
        np.testing.assert_allclose(np.ndarray((1, 4), np.float32, out.buf), X + 2)
        grpc_client.unregister_system_shared_memory(headers=gauth())
        assert not grpc_client.get_system_shared_memory_status(headers=gauth(), as_json=True).get("regions")
    finally:
        for r in (inp, out):
            r.close()
            r.unlink()
    for call in (
        lambda: grpc_client.get_cuda_shared_memory_status(headers=gauth()),
        lambda: grpc_client.register_cuda_shared_memory("c", b"\0" * 64, 0, 16, headers=gauth()),
        lambda: grpc_client.unregister_cuda_shared_memory(headers=gauth()),
        lambda: grpc_client.get_trace_settings(headers=gauth()),
        lambda: grpc_client.update_trace_settings(settings={"trace_rate": "1"}, headers=gauth()),
        lambda: grpc_client.get_log_settings(headers=gauth()),
        lambda: grpc_client.update_log_settings({"log_info": True}, headers=gauth()),
    ):
        assert "not supported" in _refused(call, "StatusCode.UNIMPLEMENTED")


def test_grpc_health_service(agent):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(agent.grpc_server.target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "inference.GRPCInferenceService"):
            assert (
                stub.Check(health_pb2.HealthCheckRequest(service=service)).status
                == health_pb2.HealthCheckResponse.SERVING
            )
        with pytest.raises(grpc.RpcError) as exc:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND
