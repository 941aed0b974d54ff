"""Hypothesis fuzz of infer request bodies: never a 5xx, always {"error": ...} on 4xx, the server stays up."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.serving import identity_all_types_model, oip_server, open_session

from agent.samples import tiny_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    tiny, ids = open_session(tiny_model(1.0), d, "tiny.onnx"), open_session(identity_all_types_model(), d, "ids.onnx")
    with oip_server([("tiny", "1", tiny), ("ids", "1", ids)], max_body_bytes=1 << 16) as srv:
        yield srv


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=20,
)
datatypes = st.sampled_from(["FP32", "FP16", "FP64", "INT64", "UINT8", "BOOL", "BYTES", "BF16", "INT4", "", 7])
tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "in_BYTES", "in_UINT8", "y", ""]),
        "datatype": datatypes,
        "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), json_values),
    },
    optional={
        "data": st.one_of(json_values, st.lists(st.floats(allow_nan=False, width=32), max_size=8)),
        "parameters": st.one_of(
            json_values, st.fixed_dictionaries({"binary_data_size": st.one_of(st.integers(-4, 40), json_values)})
        ),
    },
)
documents = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"inputs": st.lists(tensor, max_size=3)},
        optional={"outputs": json_values, "parameters": json_values, "id": json_values},
    ),
)


def _post(conn, path, body, headers):
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    return r, r.read()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    doc=documents,
    tail=st.binary(max_size=40),
    header_len=st.one_of(st.none(), st.integers(-3, 400)),
    model=st.sampled_from(["tiny", "ids", "nope"]),
)
def test_fuzzed_infer_bodies_never_5xx(server, doc, tail, header_len, model):
    head = json.dumps(doc).encode()
    body = head + tail if header_len is not None else head
    headers = {} if header_len is None else {"Inference-Header-Content-Length": str(header_len)}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        r, data = _post(conn, f"/v2/models/{model}/infer", body, headers)
        assert r.status < 500, data
        if r.status != 200:
            assert isinstance(json.loads(data)["error"], str)
    finally:
        conn.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=200))
def test_fuzzed_raw_bytes_never_5xx(server, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        r, data = _post(conn, "/v2/models/tiny/infer", body, {})
        assert r.status in (400, 413) and "error" in json.loads(data)
        conn.request("GET", "/v2/health/live")  # the same keep-alive connection still works
        assert conn.getresponse().status == 200
    finally:
        conn.close()
