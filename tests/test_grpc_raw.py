"""Infer messages handled as bytes (grpc/raw) read and write exactly what protobuf does: raw contents as views into
the message, every truncation of a message judged as protobuf judges it, responses that protobuf parses back."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from agent.serving.grpc.raw import parse_request, response_bytes
from agent.serving.proto import oip_pb2 as pb


def _request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="r-1")
    req.parameters["priority"].int64_param = 1
    req.inputs.add(name="a", datatype="FP32", shape=[2, 3])
    req.inputs.add(name="b", datatype="BYTES", shape=[0])
    req.outputs.add(name="y")
    req.raw_input_contents.append(np.arange(6, dtype=np.float32).tobytes())
    req.raw_input_contents.append(b"")
    return req


def _same(raw: bytes) -> None:
    """parse_request(raw) agrees with protobuf: same fields, same raw contents, or the same refusal."""
    try:
        want = pb.ModelInferRequest.FromString(raw)
    except DecodeError:
        with pytest.raises(DecodeError):
            parse_request(raw)
        return
    got, raws = parse_request(raw)
    assert [bytes(r) for r in raws] == list(want.raw_input_contents)
    del want.raw_input_contents[:]
    assert got == want


def test_raw_contents_are_views_into_the_message():
    raw = _request().SerializeToString()
    got, raws = parse_request(raw)
    assert got.model_name == "m" and got.id == "r-1" and len(got.inputs) == 2 and not got.raw_input_contents
    assert np.frombuffer(raws[0], "<f4").tolist() == list(range(6)) and bytes(raws[1]) == b""
    assert raws[0].obj is raw  # no copy


def test_field_order_does_not_matter():
    req = _request()
    contents = pb.ModelInferRequest(raw_input_contents=req.raw_input_contents).SerializeToString()
    del req.raw_input_contents[:]
    _same(contents + req.SerializeToString())  # raw contents first, then the rest


def test_every_truncation_and_odd_wire_format_is_judged_as_protobuf_judges_it():
    whole = _request().SerializeToString()
    for cut in range(len(whole)):
        _same(whole[:cut])
    for raw in (b"\x0b\x0c", b"\x3a" + b"\xff" * 10 + b"\x01", b"\x00", b"\x39", b"\x3a\x05ab"):
        _same(raw)


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_written_from_the_arrays_parses_back(stream):
    resp = pb.ModelInferResponse(model_name="m", model_version="1", id="r-1")
    resp.outputs.add(name="y", datatype="FP32", shape=[2, 2])
    resp.outputs.add(name="z", datatype="BOOL", shape=[0])
    y = np.arange(4, dtype=np.float32).reshape(2, 2)
    raw = response_bytes(resp, [y, b""], stream)
    back = (
        pb.ModelStreamInferResponse.FromString(raw).infer_response if stream else pb.ModelInferResponse.FromString(raw)
    )
    want = pb.ModelInferResponse()
    want.CopyFrom(resp)
    want.raw_output_contents.extend([y.tobytes(), b""])
    assert back == want
