"""Failed authentications slow down per peer and are counted in /metrics (issue 29 item 8), on HTTP and gRPC."""

from __future__ import annotations

import http.client

import grpc
import pytest
from support.serving import open_session

from agent.samples import tiny_model
from agent.serving import auth
from agent.serving.auth import AuthGate
from agent.serving.errors import TooManyFailures, Unauthorized, status_of
from agent.serving.grpc.front import GRPCServer
from agent.serving.http.server import OIPServer
from agent.serving.registry import ModelRegistry

TOKEN = "s3cret-token-of-some-length"


class Clock:
    def __init__(self) -> None:
        self.now = 1024.0

    def __call__(self) -> float:
        return self.now


def test_gate_lets_free_failures_through_then_shuts_the_peer_out_doubling(monkeypatch):
    monkeypatch.setattr(auth, "BASE_S", 0.125)  # exact in binary: the clock arithmetic below is exact
    clock = Clock()
    gate = AuthGate(TOKEN, clock=clock)
    for _ in range(auth.FREE_FAILURES):
        with pytest.raises(Unauthorized):
            gate.check("10.0.0.1", "guess", "http")
    with pytest.raises(Unauthorized):  # the first failure over the free ones: shut out for BASE_S
        gate.check("10.0.0.1", "guess", "http")
    with pytest.raises(TooManyFailures) as exc:  # even the right token is not compared meanwhile
        gate.check("10.0.0.1", TOKEN, "http")
    assert status_of(exc.value) == 429 and 0 < exc.value.retry_after <= auth.BASE_S
    gate.check("10.0.0.2", TOKEN, "http")  # another peer is not affected
    clock.now += auth.BASE_S
    with pytest.raises(Unauthorized):
        gate.check("10.0.0.1", "guess", "http")
    clock.now += auth.BASE_S  # the next shut-out is twice as long
    with pytest.raises(TooManyFailures):
        gate.check("10.0.0.1", TOKEN, "http")
    clock.now += auth.BASE_S
    gate.check("10.0.0.1", TOKEN, "http")  # right token: the record is cleared
    for _ in range(auth.FREE_FAILURES):
        with pytest.raises(Unauthorized):
            gate.check("10.0.0.1", "guess", "http")
    failed, throttled = gate.counts()
    assert failed == {"http": 2 * auth.FREE_FAILURES + 2} and throttled == {"http": 2}


def test_shut_out_is_capped_and_forgotten():
    clock = Clock()
    gate = AuthGate(TOKEN, clock=clock)
    for _ in range(40):
        try:
            gate.check("p", "x", "grpc")
        except TooManyFailures as exc:
            assert exc.retry_after <= auth.MAX_S
            clock.now += exc.retry_after
        except Unauthorized:
            pass
    clock.now += auth.FORGET_S + auth.MAX_S + 1
    with pytest.raises(Unauthorized):  # forgotten: counted from zero, not shut out
        gate.check("p", "x", "grpc")
    with pytest.raises(Unauthorized):
        gate.check("p", "x", "grpc")


def _get(port: int, path: str, token: str) -> tuple[int, dict, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def test_wrong_tokens_over_http_and_grpc_are_slowed_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "BASE_S", 30.0)  # the shut-out outlasts the test: no timing in the assertions
    reg = ModelRegistry()
    reg.activate("tiny", "1", open_session(tiny_model(1.0), tmp_path, "tiny.onnx"))
    with OIPServer(reg, port=0, token=TOKEN) as srv, GRPCServer(srv.plane, port=0) as gsrv:
        statuses = [_get(srv.port, "/v2", "wrong")[0] for _ in range(auth.FREE_FAILURES + 1)]
        assert statuses == [401] * (auth.FREE_FAILURES + 1)
        status, headers, body = _get(srv.port, "/v2", TOKEN)
        assert status == 429 and int(headers["Retry-After"]) >= 1 and b"too many wrong tokens" in body
        with grpc.insecure_channel(gsrv.target) as ch:  # gRPC: the same peer (127.0.0.1) is shut out too
            call = ch.unary_unary("/inference.GRPCInferenceService/ServerMetadata")
            with pytest.raises(grpc.RpcError) as exc:
                call(b"", metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "too many wrong tokens" in exc.value.details()
        srv.plane.auth._peers.clear()  # the operator's view: /metrics (from a peer in good standing)
        status, _, text = _get(srv.port, "/metrics", TOKEN)
        assert status == 200
        lines = text.decode().splitlines()
        assert f'edge_agent_auth_failures_total{{transport="http"}} {auth.FREE_FAILURES + 1}' in lines
        assert 'edge_agent_auth_throttled_total{transport="http"} 1' in lines
        assert 'edge_agent_auth_throttled_total{transport="grpc"} 1' in lines
