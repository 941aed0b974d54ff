"""A worker thread's kept simdjson parser (jsonfast.keep_parsers): its memory is asked of the budget's kept share
before a larger document is parsed, a refusal means a fresh parser (same tensors), a document still referenced
means a fresh parser for the next one, and dropping the keeper gives the memory back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.serving.budget import BodyBudget
from agent.serving.http import jsonfast
from agent.serving.http.decode import decode_request

SHAPE = [1, 3, 64, 64]


def _body(seed: int) -> tuple[bytes, np.ndarray]:
    x = np.random.default_rng(seed).random(SHAPE, dtype=np.float32)
    doc = {"inputs": [{"name": "x", "shape": SHAPE, "datatype": "FP32", "data": [v.item() for v in x.reshape(-1)]}]}
    body = json.dumps(doc).encode()
    assert len(body) >= jsonfast.FAST_MIN
    return body, x


@pytest.fixture
def budget():
    b = BodyBudget(256 << 20)
    jsonfast.keep_parsers(b.keep)
    yield b
    jsonfast.keep_parsers(None)


def test_kept_parser_is_counted_and_reused(budget):
    body, x = _body(0)
    doc = jsonfast.parse_infer(body)
    first = doc["inputs"][0]["data"].parser
    kept = budget.usage()[1]
    assert kept > len(body)  # at least the padded copy of the text, as parse_cost counts it
    del doc
    body2, x2 = _body(1)
    doc = jsonfast.parse_infer(body2)
    assert doc["inputs"][0]["data"].parser is first
    assert budget.usage()[1] == kept  # the same size again: nothing more asked
    del doc
    assert np.array_equal(decode_request(body2, None).inputs["x"].reshape(-1), x2.reshape(-1))
    jsonfast.keep_parsers(None)
    assert budget.usage() == (0, 0)


def test_refused_keep_parses_with_a_fresh_parser():
    tiny = BodyBudget(1 << 20)  # a quarter of it is less than the parse's cost
    jsonfast.keep_parsers(tiny.keep)
    try:
        body, x = _body(2)
        a = jsonfast.parse_infer(body)["inputs"][0]["data"].parser
        b = jsonfast.parse_infer(body)["inputs"][0]["data"].parser
        assert a is not b
        assert tiny.usage() == (0, 0)
        assert np.array_equal(decode_request(body, None).inputs["x"].reshape(-1), x.reshape(-1))
    finally:
        jsonfast.keep_parsers(None)


def test_document_still_referenced_takes_a_fresh_parser(budget):
    body, x = _body(3)
    held = jsonfast.parse_infer(body)  # its arrays stay alive across the next parse
    body2, x2 = _body(4)
    again = jsonfast.parse_infer(body2)
    assert again["inputs"][0]["data"].parser is not held["inputs"][0]["data"].parser
    assert np.array_equal(decode_request(body2, None).inputs["x"].reshape(-1), x2.reshape(-1))
    assert held["inputs"][0]["data"].arr.as_list()[:3] == [v.item() for v in x.reshape(-1)[:3]]
