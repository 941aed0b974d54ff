"""System shared memory, the fast path (issue 25): outputs the runtime writes straight into the client's region
(IOBinding, reused while the same memory is bound again), written after the run instead when the output window
overlaps an input's bytes (however registered); every bounds check still made per request, also for a shm-only
JSON header whose checked plan is cached. Real POSIX regions, a real onnxruntime session, real HTTP."""

from __future__ import annotations

import http.client
import json
import os
from multiprocessing import shared_memory

import numpy as np
import pytest
from onnx import TensorProto, helper
from support.serving import _model, oip_server, open_session

N = 64  # FP32 elements: 256 bytes


def _reverse_model():
    """y = x reversed along its last axis: an output written over its own input comes out wrong."""
    vi = helper.make_tensor_value_info
    const = helper.make_tensor
    return _model(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
        [vi("x", TensorProto.FLOAT, [1, N])],
        [vi("y", TensorProto.FLOAT, [1, N])],
        [
            const("starts", TensorProto.INT64, [1], [-1]),
            const("ends", TensorProto.INT64, [1], [-(2**62)]),
            const("axes", TensorProto.INT64, [1], [1]),
            const("steps", TensorProto.INT64, [1], [-1]),
        ],
    )


@pytest.fixture
def served(tmp_path):
    session = open_session(_reverse_model(), tmp_path, "rev.onnx")
    with oip_server([("rev", "1", session)]) as srv:
        yield srv, session


@pytest.fixture
def region():
    made = []

    def make(size: int) -> shared_memory.SharedMemory:
        name = f"ea_shmtest_{os.getpid()}_{len(made)}"
        shm = shared_memory.SharedMemory(name, create=True, size=size)
        made.append(shm)
        return shm

    yield make
    for shm in made:
        shm.close()
        shm.unlink()


def _post(srv, path: str, doc: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(doc).encode())
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, json.loads(body) if body else {}
    finally:
        conn.close()


def _register(srv, name: str, shm: shared_memory.SharedMemory, offset: int = 0, size: int = 4 * N) -> None:
    doc = {"key": "/" + shm.name, "offset": offset, "byte_size": size}
    status, body = _post(srv, f"/v2/systemsharedmemory/region/{name}/register", doc)
    assert status == 200, body


def _infer(srv, inp: str, out: str, in_off: int = 0, out_off: int = 0, out_size: int = 4 * N) -> tuple[int, dict]:
    doc = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, N],
                "datatype": "FP32",
                "parameters": {
                    "shared_memory_region": inp,
                    "shared_memory_byte_size": 4 * N,
                    "shared_memory_offset": in_off,
                },
            }
        ],
        "outputs": [
            {
                "name": "y",
                "parameters": {
                    "shared_memory_region": out,
                    "shared_memory_byte_size": out_size,
                    "shared_memory_offset": out_off,
                },
            }
        ],
    }
    return _post(srv, "/v2/models/rev/infer", doc)


def _floats(shm: shared_memory.SharedMemory, offset: int = 0) -> np.ndarray:
    return np.ndarray((1, N), "<f4", shm.buf, offset)


def test_outputs_are_written_by_the_runtime_and_inputs_read_each_request(served, region):
    srv, session = served
    a, b = region(4 * N), region(4 * N)
    _register(srv, "in", a)
    _register(srv, "out", b)
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    _floats(a)[:] = x
    status, body = _infer(srv, "in", "out")
    assert status == 200, body
    assert body["outputs"][0]["parameters"] == {"shared_memory_region": "out", "shared_memory_byte_size": 4 * N}
    assert np.array_equal(_floats(b), x[:, ::-1])
    assert session._bindings, "the output was not bound to the region (the fast path did not run)"
    for step in (1, 2):  # the same memory bound again: the cached binding reads what the region holds now
        _floats(a)[:] = x * 10 * step
        status, body = _infer(srv, "in", "out")
        assert status == 200, body
        assert np.array_equal(_floats(b), (x * 10 * step)[:, ::-1])


@pytest.mark.parametrize("same_registration", [True, False])
def test_an_output_over_its_input_is_written_after_the_run(served, region, same_registration):
    srv, session = served
    io = region(8 * N)
    _register(srv, "io", io, size=8 * N)
    if not same_registration:  # a second name for the same memory object, starting at byte 4 * N of it
        _register(srv, "alias", io, offset=4 * N, size=4 * N)
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    for in_off, out_off in ((0, 0), (4 * N, 4 * N - 8)) if same_registration else ((4 * N, 0), (4 * N - 8, 0)):
        _floats(io, in_off)[:] = x
        status, body = _infer(srv, "io", "io" if same_registration else "alias", in_off=in_off, out_off=out_off)
        assert status == 200, body
        start = out_off if same_registration else 4 * N + out_off
        assert np.array_equal(_floats(io, start), x[:, ::-1]), (in_off, out_off)
    # disjoint windows of one memory object: written by the runtime, and right
    _floats(io, 0)[:] = x
    status, body = _infer(
        srv, "io", "io" if same_registration else "alias", in_off=0, out_off=4 * N if same_registration else 0
    )
    assert status == 200, body
    assert np.array_equal(_floats(io, 4 * N), x[:, ::-1])


def test_bounds_are_checked_per_request_with_a_cached_plan(served, region):
    srv, _ = served
    a, b = region(4 * N), region(4 * N)
    _register(srv, "in", a)
    _register(srv, "out", b)
    _floats(a)[:] = 1.0
    assert _infer(srv, "in", "out")[0] == 200
    status, body = _infer(srv, "in", "out", out_size=4 * N - 4)
    assert status == 400 and "over its shared_memory_byte_size" in body["error"], body
    os.ftruncate(b._fd, 2 * N)  # the client shrank its output region: the same (cached) request is refused
    status, body = _infer(srv, "in", "out")
    assert status == 400 and "too small" in body["error"], body
    os.ftruncate(b._fd, 4 * N)
    assert _infer(srv, "in", "out")[0] == 200
    assert _post(srv, "/v2/systemsharedmemory/region/in/unregister", {})[0] == 200
    status, body = _infer(srv, "in", "out")
    assert status == 400 and "not registered" in body["error"], body


def test_the_default_run_into_copies_after_the_run(tmp_path):
    """What runtimes without output binding do (ProviderSession.run_into): run, then copy into the arrays."""
    from agent.errors import ProviderError
    from agent.providers.base import ProviderSession

    session = open_session(_reverse_model(), tmp_path, "rev.onnx")
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    into = {"y": np.zeros((1, N), "<f4")}
    assert ProviderSession.run_into(session, {"x": x}, into) is into
    assert np.array_equal(into["y"], x[:, ::-1])
    with pytest.raises(ProviderError, match="not the declared"):
        ProviderSession.run_into(session, {"x": x}, {"y": np.zeros((1, N + 1), "<f4")})
