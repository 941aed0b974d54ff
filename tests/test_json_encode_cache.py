"""The cached JSON response body (agent/serving/http/encode.py: numeric outputs asked for as JSON go out as a cached
body with only their numbers encoded per request) against the general encoder it stands in for: the same bytes,
length and header length for random tensors of every datatype (all their bit patterns: NaN and Inf go out as binary
data, as before), JSON, binary and mixed outputs, any id (the cut's mark among them), first call and cached call."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.serving.codec import DATATYPES, InferRequest, numpy_dtype
from agent.serving.http import encode
from agent.serving.http.encode import encode_general, encode_response


def _tensor(draw, datatype: str) -> np.ndarray:
    shape = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=3)))
    count = int(np.prod(shape))
    if datatype == "BYTES":
        return np.array(
            draw(st.lists(st.text(max_size=5), min_size=count, max_size=count)) or [], dtype=object
        ).reshape(shape)
    dtype = numpy_dtype(datatype)
    raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    if datatype == "BOOL":
        return (np.frombuffer(raw, dtype=np.uint8) % 2).astype(bool).reshape(shape)
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if dtype.kind in "fV" and draw(st.booleans()):  # mostly finite numbers: the JSON body, not the binary fallback
        with np.errstate(over="ignore", invalid="ignore"):
            as32 = arr.astype(np.float32)
        arr = np.where(np.isfinite(as32), as32, np.float32(draw(st.sampled_from([0.0, -1.5, 1e-7])))).astype(dtype)
    return arr


@st.composite
def responses(draw):
    names = draw(st.lists(st.sampled_from(["y", "z", "\x00data\x00", "out"]), min_size=1, max_size=3, unique=True))
    outputs = {name: _tensor(draw, draw(st.sampled_from(list(DATATYPES)))) for name in names}
    binary_default = draw(st.booleans())
    binary = {name: draw(st.booleans()) for name in names if draw(st.booleans())}
    rid = draw(st.one_of(st.none(), st.sampled_from(["", "r1", "\x00data\x00", "a\x00data\x00b"]), st.text(max_size=8)))
    return outputs, InferRequest(inputs={}, binary=binary, binary_default=binary_default, id=rid)


def _flat(result) -> tuple[bytes, int, int | None]:
    parts, total, head_len = result
    return b"".join(p if isinstance(p, bytes) else p.tobytes() for p in parts), total, head_len


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.sampled_from(["m", "\x00data\x00"]))
def test_cached_json_bodies_are_the_general_encoders_bytes(r, model):
    outputs, req = r
    want = _flat(encode_general(model, "1", outputs, req))
    assert _flat(encode_response(model, "1", outputs, req)) == want  # first call: the body is cut and kept
    assert _flat(encode_response(model, "1", outputs, req)) == want  # a repeat: from the cut body


def test_a_repeat_with_other_numbers_and_a_nan_reuses_the_body_but_not_for_the_nan():
    req = InferRequest(inputs={}, binary={"y": False}, id="r")
    for values in ([0.5, 1.0, -2.25], [3.0, 1e-7, 7e20], [1.0, float("nan"), 2.0], [float("inf"), 0.0, 1.0]):
        outputs = {"y": np.array(values, dtype=np.float32)}
        got = _flat(encode_response("m", "1", outputs, req))
        assert got == _flat(encode_general("m", "1", outputs, req))
        finite = all(np.isfinite(values))
        assert (got[2] is None) == finite  # NaN/Inf: binary data and a header length, as before
        if finite:
            assert b'"data":[' in got[0]
    assert any(key[0] == "m" for key in encode._BODIES)
