"""OIPServer over raw HTTP: every endpoint, all datatypes, client mistakes -> 4xx JSON, auth, metrics, drain."""

from __future__ import annotations

import gzip
import http.client
import json
import select
import socket
import struct
import threading
import time

import numpy as np
import pytest
from support.serving import ALL_TYPES, GatedSession, identity_all_types_model, oip_server, open_session

from agent.samples import cnn_model, tiny_model
from agent.serving.budget import JSON_DECODE_FACTOR
from agent.serving.http.server import OIPServer
from agent.serving.metrics import gauge
from agent.serving.registry import ModelRegistry


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("oip")
    sessions = [
        ("tiny", "1", open_session(tiny_model(1.0), d, "tiny.onnx"), {"provider": "cpu", "precision": "fp32"}),
        ("cnn", "3", open_session(cnn_model(), d, "cnn.onnx")),
        ("ids", "1", open_session(identity_all_types_model(), d, "ids.onnx")),
    ]
    with oip_server(sessions, max_body_bytes=1 << 20) as srv:
        yield srv


@pytest.fixture(scope="module")
def registry(server):
    return server.registry


def call(srv, method, path, body=None, headers=None, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    if conn is None:
        c.close()
    return r, data


def infer_doc(inputs, outputs=None):
    doc = {"inputs": inputs}
    if outputs is not None:
        doc["outputs"] = outputs
    return json.dumps(doc).encode()


TINY_OK = [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]


def test_server_and_model_metadata(server):
    r, body = call(server, "GET", "/v2")
    assert r.status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/tiny/ready", "/v2/models/tiny/versions/1/ready"):
        assert call(server, "GET", path)[0].status == 200, path
    meta = json.loads(call(server, "GET", "/v2/models/cnn")[1])
    assert meta["versions"] == ["3"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    tiny = json.loads(call(server, "GET", "/v2/models/tiny/versions/1")[1])
    assert tiny["parameters"] == {"provider": "cpu", "precision": "fp32"}
    cfg = json.loads(call(server, "GET", "/v2/models/ids/config")[1])
    assert cfg["max_batch_size"] == 0
    types = {i["name"]: i["data_type"] for i in cfg["input"]}
    assert types["in_FP32"] == "TYPE_FP32" and types["in_BYTES"] == "TYPE_STRING" and types["in_BOOL"] == "TYPE_BOOL"


def test_json_infer_carries_model_version(server):
    r, body = call(server, "POST", "/v2/models/tiny/infer", infer_doc(TINY_OK))
    doc = json.loads(body)
    assert r.status == 200 and doc["model_version"] == "1" and doc["model_name"] == "tiny"
    assert doc["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [2.0, 3.0, 4.0, 5.0]}]


def _sample(datatype):
    if datatype == "BYTES":
        return ["hé", "", "x" * 3]
    if datatype == "BOOL":
        return [True, False, True]
    if datatype.startswith("FP"):
        return [1.5, -2.25, 0.0]
    return [0, 7, 100] if datatype.startswith("U") else [-5, 0, 100]


def test_every_datatype_round_trips_as_json(server):
    inputs = [{"name": f"in_{t}", "shape": [3], "datatype": t, "data": _sample(t)} for t in ALL_TYPES]
    r, body = call(server, "POST", "/v2/models/ids/infer", infer_doc(inputs))
    assert r.status == 200, body
    outs = {o["name"]: o for o in json.loads(body)["outputs"]}
    for t in ALL_TYPES:
        assert outs[f"out_{t}"]["datatype"] == t
        assert outs[f"out_{t}"]["data"] == _sample(t), t


def _binary_request(inputs, blobs, outputs=None, binary_out=True):
    head = json.dumps(
        {"inputs": inputs, "outputs": outputs or [], "parameters": {"binary_data_output": binary_out}}
    ).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def _split(body, headers):
    n = int(headers["Inference-Header-Content-Length"])
    doc, rest, out = json.loads(body[:n]), body[n:], {}
    for o in doc["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]], rest = rest[:size], rest[size:]
    return doc, out


def test_every_datatype_round_trips_as_binary(server):
    inputs, blobs, expect = [], [], {}
    for t in ALL_TYPES:
        if t == "BYTES":
            blob = b"".join(struct.pack("<I", len(b)) + b for b in ("hé".encode(), b"", b"abc"))
        else:
            dtype = {"BOOL": "bool", "FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(t, t.lower())
            blob = np.array(_sample(t), dtype=dtype).tobytes()
        inputs.append({"name": f"in_{t}", "shape": [3], "datatype": t, "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
        expect[f"out_{t}"] = blob
    body, headers = _binary_request(inputs, blobs)
    r, data = call(server, "POST", "/v2/models/ids/infer", body, headers)
    assert r.status == 200, data
    assert r.getheader("Content-Type") == "application/octet-stream"
    doc, out = _split(data, {"Inference-Header-Content-Length": r.getheader("Inference-Header-Content-Length")})
    assert doc["model_version"] == "1"
    assert out == expect


def test_gzip_request_body(server):
    r, body = call(
        server, "POST", "/v2/models/tiny/infer", gzip.compress(infer_doc(TINY_OK)), {"Content-Encoding": "gzip"}
    )
    assert r.status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]


def _bytes_input(tail: bytes):
    head = json.dumps(
        {
            "inputs": [
                {"name": "in_BYTES", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(tail)}}
            ]
        }
    ).encode()
    return head + tail, {"Inference-Header-Content-Length": str(len(head))}


BAD_BINARY_HEAD = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
).encode()
CASES = [
    ("POST", "/v2/models/tiny/infer", b"{not json", {}, 400, "malformed JSON"),
    ("POST", "/v2/models/tiny/infer", b"[1, 2]", {}, 400, "JSON object"),
    ("POST", "/v2/models/tiny/infer", b"{}", {}, 400, "'inputs'"),
    ("POST", "/v2/models/nope/infer", infer_doc(TINY_OK), {}, 404, "not loaded"),
    ("POST", "/v2/models/tiny/versions/9/infer", infer_doc(TINY_OK), {}, 404, "version 9"),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "name": "z"}]), {}, 400, "unknown input"),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "shape": [2, 2]}]), {}, 400, "shape [2, 2]"),
    (
        "POST",
        "/v2/models/tiny/infer",
        infer_doc([{**TINY_OK[0], "datatype": "FP64"}]),
        {},
        400,
        "datatype FP64 does not match the model's FP32",
    ),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "datatype": "FP99"}]), {}, 400, "unknown datatype"),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "data": [1, 2, 3]}]), {}, 400, "has 3"),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "data": ["a", 1, 2, 3]}]), {}, 400, "FP32 data"),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "shape": [1, -4]}]), {}, 400, "non-negative"),
    ("POST", "/v2/models/tiny/infer", infer_doc([{**TINY_OK[0], "data": [[1, 2], [3]]}]), {}, 400, "regular array"),
    ("POST", "/v2/models/tiny/infer", infer_doc(TINY_OK, [{"name": "nope"}]), {}, 400, "no output"),
    (
        "POST",
        "/v2/models/ids/infer",
        infer_doc([{"name": "in_UINT8", "shape": [1], "datatype": "UINT8", "data": [300]}]),
        {},
        400,
        "out of range",
    ),
    (
        "POST",
        "/v2/models/tiny/infer",
        BAD_BINARY_HEAD + b"\0" * 12,
        {"Inference-Header-Content-Length": str(len(BAD_BINARY_HEAD))},
        400,
        "runs past the end",
    ),
    (
        "POST",
        "/v2/models/tiny/infer",
        BAD_BINARY_HEAD + b"\0" * 20,
        {"Inference-Header-Content-Length": str(len(BAD_BINARY_HEAD))},
        400,
        "not claimed",
    ),
    (
        "POST",
        "/v2/models/tiny/infer",
        BAD_BINARY_HEAD + b"\0" * 16,
        {"Inference-Header-Content-Length": "99999"},
        400,
        "outside the body",
    ),
    ("POST", "/v2/models/ids/infer", *_bytes_input(b"\x09\0\0\0ab"), 400, "claims 9 bytes"),
    ("POST", "/v2/models/ids/infer", *_bytes_input(b"\x02\0\0\0\xff\xfe"), 400, "not UTF-8"),
    ("POST", "/v2/models/ids/infer", *_bytes_input(b"\x01\0\0\0ab"), 400, "left over"),
    # mtime=0: gzip's header holds the time, and the test id must be the same on every xdist worker
    ("POST", "/v2/models/tiny/infer", gzip.compress(b"x", mtime=0)[:-3], {"Content-Encoding": "gzip"}, 400, "gzip"),
    ("POST", "/v2/models/tiny/infer", b"{}", {"Content-Encoding": "br"}, 400, "Content-Encoding"),
    ("GET", "/v2/models/tiny/infer", None, {}, 405, "POST"),
    ("DELETE", "/v2/models/tiny", None, {}, 405, "GET"),
    ("GET", "/v2/nothing", None, {}, 404, "no such endpoint"),
    ("GET", "/v2/models/tiny/versions/2", None, {}, 404, "version 2"),
]


@pytest.mark.parametrize("method, path, body, headers, status, fragment", CASES)
def test_client_mistakes_get_4xx_json_and_keep_alive(server, method, path, body, headers, status, fragment):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    r, data = call(server, method, path, body, headers, conn)
    assert r.status == status, data
    err = json.loads(data)["error"]
    assert fragment is None or fragment in err
    r2, _ = call(server, "POST", "/v2/models/tiny/infer", infer_doc(TINY_OK), conn=conn)  # same connection
    assert r2.status == 200
    conn.close()


def raw(srv, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(payload)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                return b"".join(chunks)
            chunks.append(b)


@pytest.mark.parametrize(
    "payload, status",
    [
        (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413),
        (
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            411,
        ),
        (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 411),
        (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
        (b'POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"in', 400),
        (b"garbage\r\n\r\n", 400),
        (b"GET /v2 HTTP/2.0\r\n\r\n", 400),
        (b"BREW /v2 HTTP/1.1\r\nConnection: close\r\n\r\n", 405),
    ],
)
def test_broken_http_gets_4xx_and_the_server_survives(server, payload, status):
    if payload.endswith(b'{"in'):  # a short body: the client gives up half way
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(65536)
    else:
        reply = raw(server, payload)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode(), reply
    assert "error" in json.loads(body)
    assert call(server, "GET", "/v2/health/live")[0].status == 200


def test_metrics_text_and_collector_hook(server):
    for _ in range(3):
        call(server, "POST", "/v2/models/tiny/infer", infer_doc(TINY_OK))
    server.add_metrics_collector(lambda: [gauge("edge_agent_cpu_temperature_celsius", "SoC temperature.", 51.5)])
    server.add_metrics_collector(lambda: 1 / 0)
    r, body = call(server, "GET", "/metrics")
    text = body.decode()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert int(lines['edge_agent_inference_requests_total{model="tiny",version="1"}']) >= 3
    assert (
        lines['edge_agent_inference_latency_seconds_bucket{model="tiny",version="1",le="+Inf"}']
        == lines['edge_agent_inference_latency_seconds_count{model="tiny",version="1"}']
    )
    assert int(lines['edge_agent_inference_rejected_total{model="tiny",version="1"}']) >= 0
    assert lines['edge_agent_model_loaded{model="cnn",version="3"}'] == "1"
    assert lines["edge_agent_cpu_temperature_celsius"] == "51.5"
    assert lines["edge_agent_metrics_collector_errors"] == "1"
    assert "# TYPE edge_agent_inference_latency_seconds histogram" in text


def test_bearer_token(registry):
    with OIPServer(registry, port=0, token="s3cret") as srv:
        r, body = call(srv, "GET", "/v2/models/tiny")
        assert r.status == 401 and "bearer token" in json.loads(body)["error"]
        assert r.getheader("WWW-Authenticate").startswith("Bearer")
        assert (
            call(srv, "POST", "/v2/models/tiny/infer", infer_doc(TINY_OK), {"Authorization": "Bearer nope"})[0].status
            == 401
        )
        assert call(srv, "GET", "/metrics")[0].status == 401
        assert call(srv, "GET", "/v2/health/ready")[0].status == 200  # probes stay open
        ok = {"Authorization": "Bearer s3cret"}
        assert call(srv, "POST", "/v2/models/tiny/infer", infer_doc(TINY_OK), ok)[0].status == 200
        srv.set_token("rotated")
        assert call(srv, "GET", "/v2/models/tiny", headers=ok)[0].status == 401
        assert call(srv, "GET", "/v2/models/tiny", headers={"Authorization": "Bearer rotated"})[0].status == 200


def test_loopback_by_default(registry):
    srv = OIPServer(registry, port=0)
    try:
        assert srv.host == "127.0.0.1"
    finally:
        srv.shutdown(1)


def test_shutdown_drains_in_flight_requests(tmp_path):
    reg = ModelRegistry()
    gated = GatedSession(open_session(tiny_model(1.0), tmp_path))
    reg.activate("m", "1", gated)
    srv = OIPServer(reg, port=0).start()
    result = {}

    def client():
        r, body = call(srv, "POST", "/v2/models/m/infer", infer_doc(TINY_OK))
        result.update(status=r.status, body=json.loads(body))

    t = threading.Thread(target=client)
    t.start()
    assert gated.entered.wait(30)
    drained = {}
    s = threading.Thread(target=lambda: drained.update(ok=srv.shutdown(30)))
    s.start()
    assert not srv.accepting or s.is_alive()
    gated.gate.set()
    t.join(30)
    s.join(30)
    assert drained == {"ok": True}
    assert result["status"] == 200 and result["body"]["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]
    with pytest.raises(OSError):
        call(srv, "GET", "/v2/health/live")


def recv_response(s: socket.socket) -> bytes:
    """One complete response (headers + Content-Length body) from a keep-alive socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def test_expect_100_continue_and_http10(server):
    body = infer_doc(TINY_OK)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        reply = recv_response(s)
        assert reply.startswith(b"HTTP/1.1 200 ") and b'"model_version":"1"' in reply
        s.sendall(b"\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # stray CRLF first, same connection
        assert recv_response(s).startswith(b"HTTP/1.1 200 ")
    reply = raw(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n")  # HTTP/1.0 without keep-alive: closed after
    assert reply.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in reply


@pytest.mark.parametrize(
    "payload, status, fragment",
    [
        (
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n{}{}",
            400,
            "conflicting",
        ),
        (b"GET /v2 HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431, "too long"),
        (b"GET /v2 HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431, "header lines"),
        (b"GET /v2 HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header"),
        (b"GET http://x/v2 HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    ],
)
def test_header_abuse_gets_4xx(server, payload, status, fragment):
    head, _, body = raw(server, payload).partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode() and b"Connection: close" in head
    assert fragment in json.loads(body)["error"]
    assert call(server, "GET", "/v2/health/live")[0].status == 200


def test_metrics_keep_both_versions_after_a_swap(tmp_path):
    reg = ModelRegistry()
    reg.activate("m", "1", open_session(tiny_model(1.0), tmp_path, "a.onnx"))
    reg.infer("m", {"x": np.zeros((1, 4), np.float32)})
    reg.activate("m", "2", open_session(tiny_model(2.0), tmp_path, "b.onnx"))
    reg.infer("m", {"x": np.zeros((1, 4), np.float32)})
    with OIPServer(reg, port=0, collectors=[lambda: [gauge("edge_agent_x", "x", 2)]]) as srv:
        text = call(srv, "GET", "/metrics")[1].decode()
    assert "\nedge_agent_x 2\n" in text
    assert 'edge_agent_inference_requests_total{model="m",version="1"} 1' in text
    assert 'edge_agent_inference_requests_total{model="m",version="2"} 1' in text
    assert 'edge_agent_model_loaded{model="m",version="2"} 1' in text
    assert 'edge_agent_model_loaded{model="m",version="1"}' not in text


def test_connection_cap_evicts_idle_first_then_keeps_probes_answerable(registry):
    with OIPServer(registry, port=0, max_connections=1, probe_slots=2) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as first:
            first.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
            assert recv_response(first).startswith(b"HTTP/1.1 200 ")
            # the cap is reached by an idle keep-alive connection: a newcomer takes its slot
            assert call(srv, "GET", "/v2")[0].status == 200
            assert first.recv(100) == b""  # the idle one was closed to make room
        _settle(srv, 0)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as busy:
            busy.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")  # a request head still arriving: not idle
            _settle(srv, 1)
            head, _, body = raw(srv, b"GET /v2 HTTP/1.1\r\n\r\n").partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 ") and json.loads(body)["error"] == "too many open connections"
            for path in ("/v2/health/live", "/v2/health/ready"):  # probes always get an answer
                r, _ = call(srv, "GET", path)
                assert r.status == 200 and r.getheader("Connection") == "close"
            busy.sendall(b"\r\n")
            assert recv_response(busy).startswith(b"HTTP/1.1 200 ")


def _settle(srv, n):
    """Wait until the server holds n connections (closed ones are reaped when the server sees the close)."""
    deadline = time.monotonic() + 10
    while srv.open_connections != n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.open_connections == n


def _identity_model():
    import onnx
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "id",
            [vi("x", TensorProto.FLOAT, ["n"])],
            [vi("y", TensorProto.FLOAT, ["n"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _metric(srv, use):
    text = call(srv, "GET", "/metrics")[1].decode()
    return float(
        next(
            line.split()[-1]
            for line in text.splitlines()
            if line.startswith(f'edge_agent_http_body_bytes{{use="{use}"}}')
        )
    )


def _released(srv, timeout: float = 30.0) -> float:
    """The `handling` bytes once they reach 0 (or whatever they are after `timeout`): the worker releases its share
    just after the answer is sent, so a client that has its answer may read the metric a moment before that."""
    deadline = time.monotonic() + timeout
    while (held := _metric(srv, "handling")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return held


def test_request_body_budget_answers_503_and_frees_on_completion(tmp_path):
    reg = ModelRegistry()
    gated = GatedSession(open_session(_identity_model(), tmp_path, "id.onnx"))
    reg.activate("big", "1", gated)
    reg.activate("tiny", "1", open_session(tiny_model(1.0), tmp_path, "tiny.onnx"))
    srv = OIPServer(reg, port=0, max_body_bytes=2 << 20, body_budget_bytes=3 << 20).start()
    x = np.arange(400_000, dtype=np.float32)  # 1.6 MB: two do not fit in 3 MiB
    head = json.dumps(  # binary outputs: 400,000 floats as JSON would not fit the 3 MiB budget (outsize.py)
        {
            "inputs": [
                {"name": "x", "shape": [x.size], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    first = {}
    t = threading.Thread(
        target=lambda: first.update(r=call(srv, "POST", "/v2/models/big/infer", head + x.tobytes(), headers))
    )
    try:
        t.start()
        assert gated.entered.wait(30)
        assert _metric(srv, "handling") == len(head) + x.nbytes + len(head) * JSON_DECODE_FACTOR  # body + its JSON
        r, body = call(srv, "POST", "/v2/models/big/infer", head + x.tobytes(), headers)
        assert r.status == 503 and r.getheader("Retry-After") == "1" and r.getheader("Connection") == "close"
        assert "budget" in json.loads(body)["error"]
        r, body = call(srv, "POST", "/v2/models/tiny/infer", infer_doc(TINY_OK))  # small bodies still served
        assert r.status == 200
        gated.gate.set()
        t.join(30)
        assert first["r"][0].status == 200
        _released(srv)
        r, body = call(srv, "POST", "/v2/models/big/infer", head + x.tobytes(), headers)  # room again
        assert r.status == 200 and r.getheader("Inference-Header-Content-Length")
        assert _released(srv) == 0
        assert _metric(srv, "kept") == 0  # a 1.6 MB buffer is over a quarter of the budget: not kept
    finally:
        gated.gate.set()
        srv.shutdown(10)
        reg.close()


def test_kept_read_buffers_are_counted_and_released_with_the_connection(registry):
    srv = OIPServer(registry, port=0).start()
    try:
        x = np.zeros((200, 3, 32, 32), np.float32)  # 2.4 MB into the cnn (dynamic batch)
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes},
                    }
                ]
            }
        ).encode()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        r, _ = call(
            srv,
            "POST",
            "/v2/models/cnn/infer",
            head + x.tobytes(),
            {"Inference-Header-Content-Length": str(len(head))},
            conn=conn,
        )
        assert r.status == 200
        kept = _metric(srv, "kept")
        assert kept >= x.nbytes
        conn.close()
        deadline = time.monotonic() + 10
        while _metric(srv, "kept") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _metric(srv, "kept") == 0
    finally:
        srv.shutdown(10)


def test_refused_large_body_still_gets_its_answer(server):
    """413 without reading an 8 MB body: the server discards it after answering, so the client, still sending
    when the answer goes out, reads the 413 instead of a broken pipe or a reset."""
    for _ in range(3):
        r, body = call(
            server, "POST", "/v2/models/tiny/infer", b"\0" * (8 << 20), {"Content-Type": "application/octet-stream"}
        )
        assert r.status == 413 and "exceeds the limit" in json.loads(body)["error"]
    assert call(server, "GET", "/v2/health/live")[0].status == 200


def _trickle_until_closed(s: socket.socket, data: bytes, limit_s: float = 30.0) -> bytes:
    """Send data one byte per 0.05 s (cycling) until the server answers and closes; what it sent back."""
    s.settimeout(0.05)
    got, i, end = b"", 0, time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            s.send(data[i % len(data) : i % len(data) + 1])
            i += 1
        except OSError:
            pass
        try:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk
        except TimeoutError:
            pass
        except OSError:
            return got
    pytest.fail(f"the server kept a trickling connection open for {limit_s} s")


def test_header_deadline_counts_from_the_first_byte(registry):
    with OIPServer(registry, port=0, header_timeout=0.5) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(b"GET /v2 HTTP/1.1\r\n")
            reply = _trickle_until_closed(s, b"X-Slow: 1\r\n")  # every byte arrives in time, the head never does
        assert reply.startswith(b"HTTP/1.1 408 ") and b"request head not complete" in reply
        assert call(srv, "GET", "/v2")[0].status == 200


def test_a_slow_body_hits_the_whole_request_deadline(registry):
    with OIPServer(registry, port=0, header_timeout=0.5, request_timeout=1.0) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 100000\r\n\r\n")
            reply = _trickle_until_closed(s, b"{")
        assert reply.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in reply
        assert call(srv, "GET", "/v2")[0].status == 200


def _from(srv, source: str) -> socket.socket:
    s = socket.socket()
    s.settimeout(30)
    s.bind((source, 0))
    s.connect(("127.0.0.1", srv.port))
    return s


def test_per_peer_cap_sheds_that_peer_only(registry):
    with OIPServer(registry, port=0, max_per_peer=2, probe_slots=2) as srv:
        busy = [_from(srv, "127.0.0.1") for _ in range(2)]
        try:
            for s in busy:
                s.sendall(b"GET /v2 HTTP/1.1\r\n")  # heads still arriving: nothing idle to close
            _settle(srv, 2)
            third = _from(srv, "127.0.0.1")
            third.sendall(b"GET /v2 HTTP/1.1\r\n\r\n")
            assert recv_response(third).startswith(b"HTTP/1.1 503 ")  # over its peer's cap: a probe slot only
            third.close()
            other = _from(srv, "127.0.0.2")  # another address is not affected
            other.sendall(b"GET /v2 HTTP/1.1\r\n\r\n")
            assert recv_response(other).startswith(b"HTTP/1.1 200 ")
            other.close()
            probe = _from(srv, "127.0.0.1")
            probe.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
            assert recv_response(probe).startswith(b"HTTP/1.1 200 ")
            probe.close()
            for s in busy:  # their heads complete: both answered
                s.sendall(b"\r\n")
                assert recv_response(s).startswith(b"HTTP/1.1 200 ")
            # now both are idle keep-alive connections: a newcomer from the same address takes the oldest's slot
            deadline = time.monotonic() + 10
            while srv.idle_connections < 2 and time.monotonic() < deadline:  # workers hand them back
                time.sleep(0.01)
            newcomer = _from(srv, "127.0.0.1")
            newcomer.sendall(b"GET /v2 HTTP/1.1\r\n\r\n")
            assert recv_response(newcomer).startswith(b"HTTP/1.1 200 ")
            closed, _, _ = select.select(busy, [], [], 30)  # one of the two (the first handed back) was closed
            assert len(closed) >= 1 and closed[0].recv(100) == b""
            newcomer.close()
        finally:
            for s in busy:
                s.close()
