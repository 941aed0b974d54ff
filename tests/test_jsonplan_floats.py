"""jsonplan's direct conversion of a cached slot of JSON floats (FP16/FP32/FP64) against the full parser: the same
tensor bytes, or the same refusal word for word, for numbers at and around each datatype's largest finite value,
huge and tiny ones, integers among the floats (big ones convert differently) and a wrong count."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.serving.errors import InvalidInput
from agent.serving.http import jsonplan
from agent.serving.http.decode import decode_request

EDGES = {
    "FP16": [65504.0, 65519.99, 65520.0, 65535.0, 6e-8, 1e-9],
    "FP32": [3.4028234663852886e38, 3.4028235677973362e38, 3.4028235677973366e38, 3.5e38, 1e-46],
    "FP64": [1.7976931348623157e308, 5e-324],
}


def _body(datatype: str, text: str, count: int) -> bytes:
    return b'{"inputs":[{"name":"x","shape":[%d],"datatype":"%s","data":%s}]}' % (
        count,
        datatype.encode(),
        text.encode(),
    )


def _outcome(body: bytes):
    try:
        arr = decode_request(body, None).inputs["x"]
    except InvalidInput as exc:
        return "err", str(exc)
    return "ok", (str(arr.dtype), arr.shape, arr.tobytes())


def _cached_vs_full(datatype: str, values: list, count: int | None = None, text: str | None = None):
    text = json.dumps(values) if text is None else text
    count = len(values) if count is None else count
    jsonplan.clear()
    full = _outcome(_body(datatype, text, count))  # nothing cached: the full parser
    assert _outcome(_body(datatype, json.dumps([0.5] * count), count))[0] == "ok"  # the template
    assert jsonplan.cached(_body(datatype, text, count))
    cached = _outcome(_body(datatype, text, count))
    jsonplan.clear()
    return cached, full


@pytest.mark.parametrize("datatype", sorted(EDGES))
def test_edges_of_each_float_datatype_decode_as_the_full_parser_does(datatype):
    for edge in EDGES[datatype]:
        for v in (edge, -edge):
            cached, full = _cached_vs_full(datatype, [0.25, v, 1.5])
            assert cached == full
    for ints in ([2**54 + 2**30 + 1], [2**54 + 2**30 + 1, 3], [2**64 + 2**40 + 1]):  # rounded once, or twice
        cached, full = _cached_vs_full(datatype, ints)
        assert cached == full
    cached, full = _cached_vs_full(datatype, [1.0], text="[1e400]")
    assert cached == full and full[0] == "err"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(EDGES)),
    st.lists(
        st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70)),
        min_size=1,
        max_size=6,
    ),
    st.integers(-1, 1),
)
def test_floats_ints_and_counts_decode_as_the_full_parser_does(datatype, values, lie):
    cached, full = _cached_vs_full(datatype, values, count=max(1, len(values) + lie))
    assert cached == full
