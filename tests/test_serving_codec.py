"""Response encoding: the zero-copy fast path sends exactly the bytes of the general encoder; send_all delivers
every buffer in order even when the kernel takes them in several pieces."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from agent.serving.codec import InferRequest
from agent.serving.http.encode import encode_general, encode_response
from agent.serving.http.wire import send_all


def _flat(parts) -> bytes:
    return b"".join(p if isinstance(p, bytes) else p.tobytes() for p in parts)


OUTPUTS = [
    {"y": np.arange(12, dtype=np.float32).reshape(3, 4)},
    {"a": np.array(2.5, dtype=np.float64), "b": np.array([True, False, True]), "c": np.arange(5, dtype=np.int64)},
    {"h": np.ones((2, 2), np.float16), "u": np.arange(7, dtype=np.uint8), "e": np.zeros((0, 3), np.int32)},
]


@pytest.mark.parametrize("outputs", OUTPUTS)
@pytest.mark.parametrize("rid", [None, "req-7"])
def test_fast_path_bytes_equal_the_general_encoder(outputs, rid):
    req = InferRequest(inputs={}, binary_default=True, id=rid)
    parts, total, head_len = encode_response("m", "3", outputs, req)
    assert any(isinstance(p, np.ndarray) for p in parts)  # the arrays themselves go on the wire
    gparts, gtotal, ghead = encode_general("m", "3", outputs, req)
    assert (_flat(parts), total, head_len) == (_flat(gparts), gtotal, ghead)
    assert len(_flat(parts)) == total


def test_cached_header_follows_shape_version_and_id():
    req = InferRequest(inputs={}, binary_default=True)
    a, _, _ = encode_response("m", "1", {"y": np.zeros((2, 3), np.float32)}, req)
    b, _, _ = encode_response("m", "1", {"y": np.ones((2, 3), np.float32)}, req)
    assert a[0] == b[0] and _flat(b[1:]) == np.ones((2, 3), np.float32).tobytes()
    c, _, _ = encode_response("m", "1", {"y": np.zeros((4, 3), np.float32)}, req)
    d, _, _ = encode_response("m", "2", {"y": np.zeros((2, 3), np.float32)}, req)
    e, _, _ = encode_response(
        "m", "1", {"y": np.zeros((2, 3), np.float32)}, InferRequest({}, binary_default=True, id="x")
    )
    assert b'"shape":[4,3]' in c[0] and b'"model_version":"2"' in d[0] and b'"id":"x"' in e[0]


@pytest.mark.parametrize(
    "value, binary",
    [
        (np.arange(6, dtype=np.float32).reshape(2, 3).T, True),  # not C-contiguous: copied by the general path
        (np.arange(3, dtype=">f4"), True),  # big-endian: swapped to the wire's little-endian
        (np.array(["a", "bc"], dtype=object), True),  # BYTES: length-prefixed elements
        (np.arange(3, dtype=np.float32), False),  # JSON data
    ],
)
def test_other_outputs_take_the_general_encoder(value, binary):
    req = InferRequest(inputs={}, binary_default=binary)
    parts, total, head_len = encode_response("m", "1", {"y": value}, req)
    assert all(isinstance(p, bytes) for p in parts) and len(_flat(parts)) == total
    if binary and value.dtype != object:
        assert _flat(parts)[head_len:] == np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()


def test_send_all_finishes_partial_sends_in_order():
    a, b = socket.socketpair()
    a.settimeout(30)
    big = np.random.default_rng(0).integers(0, 255, 12 << 20, dtype=np.uint8).reshape(3, -1)  # > socket buffers
    parts = [b"head", big, b"", np.arange(1000, dtype=np.float64), b"tail"]
    expect = _flat(parts)
    got = bytearray()

    def read():
        while len(got) < len(expect):
            chunk = b.recv(1 << 20)
            if not chunk:
                return
            got.extend(chunk)

    t = threading.Thread(target=read)
    t.start()
    send_all(a, parts, len(expect))
    t.join(30)
    a.close(), b.close()
    assert bytes(got) == expect


def test_cached_request_plan_decodes_every_kind_of_binary_input():
    import json
    import struct

    from agent.serving.http.decode import decode_request

    tensors = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([True, False, True]),
        "e": np.zeros((0, 2), np.int64),
        "s": np.array(["hé", "", "x"], dtype=object),
    }
    blobs = {
        k: (b"".join(struct.pack("<I", len(x.encode())) + x.encode() for x in v) if v.dtype == object else v.tobytes())
        for k, v in tensors.items()
    }
    types = {"f": "FP32", "b": "BOOL", "e": "INT64", "s": "BYTES"}
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": k,
                    "shape": list(v.shape),
                    "datatype": types[k],
                    "parameters": {"binary_data_size": len(blobs[k])},
                }
                for k, v in tensors.items()
            ]
        }
    ).encode()
    body = head + b"".join(blobs.values())
    for _ in range(2):  # the first request makes the plan, the second uses it
        req = decode_request(memoryview(bytearray(body)), len(head))
        for k, v in tensors.items():
            assert req.inputs[k].shape == v.shape and req.inputs[k].dtype == v.dtype
            assert req.inputs[k].tolist() == v.tolist()
