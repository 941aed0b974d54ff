"""The large-body JSON parser (agent/serving/http/jsonfast.py) against the strict Python one it stands in for: the same
tensors from every valid request of every datatype, flat and nested, and the same refusal, word for word, of every
malformed one (lying shapes, ragged or hidden nesting, malformed numbers, NaN/Inf text, out-of-range integers,
strings among numbers). A body takes the fast path from FAST_MIN bytes: the same request padded with trailing
whitespace (valid JSON) past that size is parsed by simdjson, unpadded by the Python parser."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.serving.budget import JSON_DECODE_FACTOR, BodyBudget, Ledger, parse_cost
from agent.serving.codec import DATATYPES, numpy_dtype
from agent.serving.errors import InvalidInput, PayloadTooLarge
from agent.serving.http import jsonfast, jsonplan
from agent.serving.http.decode import decode_request

PAD = b" " * jsonfast.FAST_MIN
NUMERIC = [d for d in DATATYPES if d not in ("BYTES", "BOOL")]


def _outcome(body: bytes):
    """('ok', {name: (dtype, shape, values)}) or ('err', message) for one decode of `body`."""
    try:
        req = decode_request(body, None)
    except InvalidInput as exc:
        return "err", str(exc)
    out = {}
    for name, arr in req.inputs.items():
        values = arr.tolist() if arr.dtype.kind == "O" else arr.tobytes()
        out[name] = (str(arr.dtype), arr.shape, values)
    return "ok", out


def _both(text: bytes):
    slow = _outcome(text)
    fast = _outcome(text + PAD)
    return slow, fast


@st.composite
def tensors(draw):
    datatype = draw(st.sampled_from(list(DATATYPES)))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    count = int(np.prod(shape))
    if datatype == "BYTES":
        flat = draw(st.lists(st.text(max_size=6), min_size=count, max_size=count))
    elif datatype == "BOOL":
        flat = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    elif datatype in ("FP16", "FP32", "FP64", "BF16"):
        dtype = numpy_dtype(datatype)
        big = float(np.finfo(dtype).max) if datatype != "BF16" else 3.0e38
        num = st.one_of(
            st.floats(-big, big, allow_nan=False, allow_infinity=False),
            st.integers(-min(2**53, int(big)), min(2**53, int(big))),
        )
        flat = draw(st.lists(num, min_size=count, max_size=count))
    else:
        info = np.iinfo(numpy_dtype(datatype))
        flat = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=count, max_size=count))
    nested = draw(st.booleans())
    data = np.array(flat, dtype=object).reshape(shape).tolist() if nested else flat
    return datatype, shape, data


def _doc(datatype, shape, data) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]}).encode()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors())
def test_valid_requests_decode_alike(t):
    text = _doc(*t)
    slow, fast = _both(text)
    assert slow[0] == "ok", slow
    assert fast == slow
    data = jsonfast.parse_infer(text + PAD)["inputs"][0]["data"]
    if t[0] != "BYTES":  # strings with escapes or a '[' are left to the Python parser
        assert isinstance(data, jsonfast.NumericData), t  # simdjson parsed it


# textual lies and malformations, applied to the JSON text of a valid request's data
MUTATIONS = [
    lambda s: s.replace("[", "[[", 1),  # one level deeper at the start: ragged or too deep
    lambda s: s[:-1] + ",1]",  # one element more than the shape holds
    lambda s: s[:-1] + ",[1]]",  # an array where a number belongs
    lambda s: s[:-1] + ",NaN]",
    lambda s: s[:-1] + ",-Infinity]",
    lambda s: s[:-1] + ",1e400]",  # a float Python reads as inf
    lambda s: s[:-1] + ",100000000000000000000000]",  # beyond 64 bits
    lambda s: s[:-1] + ",18446744073709551615]",  # uint64's largest
    lambda s: s[:-1] + ",-1]",
    lambda s: s[:-1] + ",1.5]",
    lambda s: s[:-1] + ',"1"]',
    lambda s: s[:-1] + ",true]",
    lambda s: s[:-1] + ",null]",
    lambda s: s[:-1] + ",01]",
    lambda s: s[:-1] + ",1.]",
    lambda s: s[:-1] + ",+1]",
    lambda s: s[:-1] + ",]",
    lambda s: s[:-1] + ",[]]",
    lambda s: s[:-1],  # unterminated
    lambda s: s.replace(",", ",,", 1),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors(), st.integers(0, len(MUTATIONS) - 1), st.booleans())
def test_malformed_requests_are_refused_alike(t, which, smaller_shape):
    datatype, shape, data = t
    text = MUTATIONS[which](json.dumps(data))
    if smaller_shape:  # the shape lies about the element count instead (the data is then valid)
        shape, text = [max(1, int(np.prod(shape)) - 1)], json.dumps(data)
    body = b'{"inputs": [{"name": "x", "shape": %s, "datatype": "%s", "data": %s}]}' % (
        json.dumps(shape).encode(),
        datatype.encode(),
        text.encode(),
    )
    slow, fast = _both(body)
    assert fast == slow


def _flat_body(datatype, shape, text: str) -> bytes:
    return b'{"inputs": [{"name": "x", "shape": %s, "datatype": "%s", "data": %s}], "outputs": [{"name": "y"}]}' % (
        json.dumps(shape).encode(),
        datatype.encode(),
        text.encode(),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors(), st.integers(-1, len(MUTATIONS) - 1))
def test_a_cached_small_header_decodes_as_the_full_parser_does(t, which):
    """jsonplan: a small request repeating a header checked before parses only its numbers: the same tensors and
    the same refusals as the full parser, whatever numbers (or lies) the repeat carries."""
    datatype, shape, data = t
    flat = json.dumps(np.array(data, dtype=object).reshape(-1).tolist())
    first = _flat_body(datatype, shape, flat)
    repeat = _flat_body(datatype, shape, MUTATIONS[which](flat) if which >= 0 else flat)
    jsonplan.clear()
    expected = _outcome(repeat)  # nothing cached: the full parser
    jsonplan.clear()
    assert _outcome(first)[0] == "ok"
    if datatype not in ("BOOL", "BYTES"):  # numbers only in its data: a template now
        assert jsonplan.cached(first)
    assert _outcome(repeat) == expected
    jsonplan.clear()


def test_a_template_is_kept_only_where_the_slot_is_the_inputs_data():
    body = b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}], "extra": {"data": [3]}}'
    slow = _outcome(body)
    assert slow[0] == "ok" and not jsonplan.cached(body)  # a second slot, outside the inputs
    keyed = b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "x\\"data": [1, 2], "data": [1, 2]}]}'
    assert _outcome(keyed)[0] == "ok" and not jsonplan.cached(keyed)  # a key that ends in "data" is no slot
    jsonplan.clear()


@pytest.mark.parametrize(
    "doc",
    [
        b'{"id": "[", "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}',
        b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2], "data": [3, 4]}]}',
        b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [[1], [[2]]]}]}',
        b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["\\ud800", 1]}]}',
        b'\xef\xbb\xbf{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}',
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": '
        + b'{"a": ' * 400
        + b"1"
        + b"}" * 400
        + b"}]}",
    ],
)
def test_what_the_fast_path_cannot_vouch_for_is_judged_by_the_python_parser(doc):
    slow, fast = _both(doc)
    assert fast == slow


def test_an_image_tensor_is_charged_about_its_body_plus_its_tensor():
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    body = _doc("FP32", list(x.shape), [float(v) for v in x.reshape(-1)])
    ledger = Ledger(BodyBudget(1 << 30))
    req = decode_request(body, None, ledger.charge)
    assert np.array_equal(req.inputs["x"], x)
    # the parse (tape, index, copies) and the tensor, never the Python parser's 32 bytes per byte of JSON
    assert x.nbytes < ledger.held < 5 * len(body)
    ledger.close()


@pytest.mark.parametrize("room", ["parse", "tensor"])
def test_a_refused_json_request_names_the_binary_extension_and_its_size(room):
    x = np.zeros((1, 3, 224, 224), dtype=np.float32)
    body = _doc("FP32", list(x.shape), x.reshape(-1).tolist())
    charges: list[tuple[int, str]] = []
    decode_request(body, None, lambda n, what: charges.append((n, what)))
    parse = charges[0][0]
    header = sum(n for n, what in charges if "tensor" not in what)
    assert parse >= parse_cost(len(body), body.count(b"[") + body.count(b"{"), body.count(b",") + body.count(b":"))
    ledger = Ledger(BodyBudget(parse - 1 if room == "parse" else header + 16))  # the tensor does not fit then
    with pytest.raises(PayloadTooLarge) as refused:
        decode_request(body, None, ledger.charge)
    message = str(refused.value)
    assert "Inference-Header-Content-Length" in message and "binary_data_size" in message, message
    if room == "tensor":
        assert f"input 'x' would take {x.nbytes} bytes" in message, message
    else:  # before the parse: estimated from the separators in the body
        estimate = int(re.search(r"about (\d+) bytes as FP32", message).group(1))
        assert abs(estimate - x.nbytes) < x.nbytes / 1000, message


def _charges(body: bytes) -> list[tuple[int, str]]:
    charges: list[tuple[int, str]] = []
    try:
        decode_request(body, None, lambda n, what: charges.append((n, what)))
    except InvalidInput:
        pass
    return charges


def test_a_long_string_in_the_header_is_counted_before_it_is_made():
    name = "é" * 100_000 + "\U0001d11e"  # one astral character: Python holds the string at 4 bytes a character
    body = json.dumps(
        {"id": name, "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}, ensure_ascii=False
    ).encode()
    assert len(body) >= jsonfast.FAST_MIN and isinstance(
        jsonfast.parse_infer(body)["inputs"][0]["data"], jsonfast.NumericData
    )
    first = _charges(body)[0][0]
    assert first >= 4 * len(name.encode()), (first, len(body))


def test_a_large_header_is_left_to_the_python_parser_and_counted_as_before():
    body = json.dumps(
        {"extra": [0] * 40_000, "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
    ).encode()
    assert len(body) >= jsonfast.FAST_MIN
    assert not isinstance(jsonfast.parse_infer(body)["inputs"][0]["data"], jsonfast.NumericData)
    assert sum(n for n, _ in _charges(body)) >= len(body) * JSON_DECODE_FACTOR
