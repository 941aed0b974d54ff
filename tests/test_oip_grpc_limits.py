"""The gRPC front end under hostile clients, in its own process (RSS measured apart): messages over the size limit
are refused before they are allocated, malformed protobuf never crashes it nor grows it without bound, a crowd of
idle connections and of calls over the concurrency cap does not lock other clients out."""

from __future__ import annotations

import os
import socket
import threading

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oip_proc import served

from agent.serving.proto import oip_pb2 as pb

MAX_BODY = 8 << 20
BUDGET = 32 << 20
SLACK = 64 << 20
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def srv():
    with served(max_body_bytes=MAX_BODY, body_budget_bytes=BUDGET, grpc={"max_rpcs": 8, "workers": 4}) as s:
        s.watch()
        yield s
        s.stop()
        print(f"\nserver RSS {s.rss0 >> 20} MiB at start, peak {s.rss_peak >> 20} MiB")
        assert s.rss_peak - s.rss0 <= BUDGET + SLACK, (s.rss0, s.rss_peak)


@pytest.fixture(scope="module")
def channel(srv):
    opts = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}", options=opts) as ch:
        yield ch


def _tiny_request(value: float = 1.0) -> bytes:
    req = pb.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.full((1, 4), value, np.float32).tobytes())
    return req.SerializeToString()


def _infer(channel, body: bytes, timeout: float = 30):
    return channel.unary_unary(INFER)(body, timeout=timeout)


def test_a_good_request_is_served(channel):
    resp = pb.ModelInferResponse.FromString(_infer(channel, _tiny_request(1.0)))
    assert np.frombuffer(resp.raw_output_contents[0], "<f4").tolist() == [2.0] * 4


def test_a_message_over_the_limit_is_refused_before_allocation(srv, channel):
    before = srv.rss_peak
    req = pb.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(b"\0" * (MAX_BODY + 1024))
    with pytest.raises(grpc.RpcError) as exc:
        _infer(channel, req.SerializeToString())
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert srv.rss_peak - before < MAX_BODY  # the server never held the message


def test_a_lying_length_prefix_is_refused(srv):
    """Bytes that claim a 2 GB gRPC message on a bare socket (no valid HTTP/2 framing around them) are dropped with
    the connection: no allocation follows, and the server keeps serving (the next tests use it)."""
    with socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        s.sendall(b"\x00\x7f\xff\xff\xff" * 100)
    assert srv.rss_peak - srv.rss0 < BUDGET + SLACK


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.binary(max_size=512),
        st.builds(
            lambda b, i, v: b[:i] + bytes([v]) + b[i + 1 :],
            st.just(_tiny_request()),
            st.integers(0, 60),
            st.integers(0, 255),
        ),
        st.builds(lambda b, n: b[:n], st.just(_tiny_request()), st.integers(0, 80)),
    )
)
def test_malformed_protobuf_never_crashes_the_server(channel, body):
    try:
        _infer(channel, body, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ), (exc.code(), exc.details())


def test_after_the_fuzz_it_still_serves_within_memory(srv, channel):
    test_a_good_request_is_served(channel)
    assert srv.rss_peak - srv.rss0 <= BUDGET + SLACK
    assert not srv.live_failures


def test_idle_connections_and_calls_over_the_cap_do_not_lock_others_out(srv, channel):
    idle = []
    for _ in range(200):  # idle TCP connections (never a byte sent) and idle HTTP/2 ones
        idle.append(socket.create_connection(("127.0.0.1", srv.grpc_port)))
    slow = []
    for _ in range(20):  # slow senders: a preface and half a frame, then nothing
        s = socket.create_connection(("127.0.0.1", srv.grpc_port))
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00")
        slow.append(s)
    results: list[str] = []

    def burst():
        try:
            _infer(channel, _tiny_request(), timeout=60)
            results.append("ok")
        except grpc.RpcError as exc:
            results.append(exc.code().name)

    threads = [threading.Thread(target=burst) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        # refused within bounds: over the per-client cap (RESOURCE_EXHAUSTED) or admission full (ServerBusy ->
        # UNAVAILABLE, HTTP's 503), never hung or failed otherwise; and someone is served
        assert set(results) <= {"ok", "RESOURCE_EXHAUSTED", "UNAVAILABLE"} and results.count("ok") >= 1, results
        test_a_good_request_is_served(channel)  # a client still gets through
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as other:  # and a new one too
            resp = pb.ModelInferResponse.FromString(_infer(other, _tiny_request(2.0)))
            assert np.frombuffer(resp.raw_output_contents[0], "<f4").tolist() == [3.0] * 4
    finally:
        for s in idle + slow:
            s.close()
    assert os.path.exists(f"/proc/{srv.pid}")
