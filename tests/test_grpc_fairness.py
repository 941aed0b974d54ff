"""gRPC fairness: one client address cannot take every call slot (max_per_peer), open streams are capped (each holds
a handler thread in grpcio's sync server) and an idle stream is cancelled after idle_timeout, so a crowd of idle
streams cannot lock other clients out."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import numpy as np
import pytest
from support.serving import GatedSession, open_session

from agent.samples import tiny_model
from agent.serving.grpc.front import GRPCServer
from agent.serving.http.server import OIPServer
from agent.serving.proto import oip_pb2 as pb
from agent.serving.registry import ModelRegistry

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def _request(model: str) -> bytes:
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return req.SerializeToString()


def _wait(pred, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def servers(tmp_path):
    reg = ModelRegistry()
    gated = GatedSession(open_session(tiny_model(1.0), tmp_path, "g.onnx"))
    reg.activate("gated", "1", gated)
    reg.activate("tiny", "1", open_session(tiny_model(1.0), tmp_path, "t.onnx"))
    http = OIPServer(reg, port=0).start()
    g = GRPCServer(http.plane, port=0, workers=4, max_rpcs=8, max_per_peer=2, idle_timeout=1.0).start()
    try:
        yield g, gated
    finally:
        gated.gate.set()
        g.shutdown(2)
        http.shutdown(2)


def test_one_client_cannot_take_every_slot(servers):
    g, gated = servers
    with grpc.insecure_channel(g.target) as ch:
        call = ch.unary_unary(INFER)
        results: list = []
        threads = [
            threading.Thread(target=lambda: results.append(call(_request("gated"), timeout=60))) for _ in range(2)
        ]
        for t in threads:
            t.start()
        _wait(lambda: g.servicer._busy.get("127.0.0.1") == 2, "two calls in flight")
        with pytest.raises(grpc.RpcError) as exc:
            call(_request("tiny"), timeout=30)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "calls in flight" in exc.value.details()
        gated.gate.set()
        for t in threads:
            t.join(60)
        assert len(results) == 2
        pb.ModelInferResponse.FromString(call(_request("tiny"), timeout=30))  # slots given back


def test_streams_are_capped_and_idle_ones_cancelled(servers):
    g, _ = servers
    assert g.streams.limit == 1  # workers // 4
    with grpc.insecure_channel(g.target) as ch:
        feed: queue.Queue = queue.Queue()
        first = ch.stream_stream(STREAM)(iter(feed.get, None), timeout=60)
        feed.put(_request("tiny"))
        resp = pb.ModelStreamInferResponse.FromString(next(first))
        assert resp.infer_response.model_name == "tiny"
        with pytest.raises(grpc.RpcError) as exc:  # a second stream while the first is open
            next(ch.stream_stream(STREAM)(iter([_request("tiny")]), timeout=30))
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        pb.ModelInferResponse.FromString(ch.unary_unary(INFER)(_request("tiny"), timeout=30))  # unary unaffected
        with pytest.raises(grpc.RpcError) as exc:  # the first, idle past idle_timeout (1 s), is cancelled
            next(first)
        assert exc.value.code() == grpc.StatusCode.CANCELLED
        _wait(lambda: not g.streams._open, "the idle stream to close")
        again = ch.stream_stream(STREAM)(iter([_request("tiny")]), timeout=30)
        assert pb.ModelStreamInferResponse.FromString(next(again)).infer_response.model_name == "tiny"
        feed.put(None)
