"""System shared memory. By default regions are read with preadv and written with pwrite, never mapped: a client
that shrinks its region while requests read it fails those requests with a 400 and the daemon lives on
(issue 34). With shm_in_place, the fast path (issue 25): outputs the runtime writes straight into the client's
region (IOBinding, reused while the same memory is bound again), written after the run instead when the output
window overlaps an input's bytes (however registered). Every bounds check is made per request in both modes,
also for a shm-only JSON header whose checked plan is cached. Real POSIX regions, a real onnxruntime session,
real HTTP, and a real daemon."""

from __future__ import annotations

import http.client
import json
import os
from multiprocessing import shared_memory
from types import SimpleNamespace

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
    with oip_server([("rev", "1", session)], shm_in_place=True) as srv:
        yield srv, session


@pytest.fixture
def copying(tmp_path):
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


def _in_out(srv, region) -> tuple[shared_memory.SharedMemory, shared_memory.SharedMemory]:
    """Two new regions of one (1, N) float32 tensor each, registered with `srv` as "in" and "out"."""
    a, b = region(4 * N), region(4 * N)
    _register(srv, "in", a)
    _register(srv, "out", b)
    return a, b


def _floats(shm: shared_memory.SharedMemory, offset: int = 0) -> np.ndarray:
    return np.ndarray((1, N), "<f4", shm.buf, offset)


def test_outputs_are_written_by_the_runtime_and_inputs_read_each_request(served, region):
    srv, session = served
    a, b = _in_out(srv, region)
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


@pytest.mark.parametrize("mode", ["served", "copying"])
def test_bounds_are_checked_per_request_with_a_cached_plan(mode, request, region):
    srv, _ = request.getfixturevalue(mode)
    a, b = _in_out(srv, region)
    _floats(a)[:] = 1.0
    assert _infer(srv, "in", "out")[0] == 200
    status, body = _infer(srv, "in", "out", out_size=4 * N - 4)
    assert status == 400 and "over its shared_memory_byte_size" in body["error"], body
    os.ftruncate(b._fd, 2 * N)  # the client shrank its output region: the same (cached) request is refused
    status, body = _infer(srv, "in", "out")
    assert status == 400 and "too small" in body["error"], body
    assert os.fstat(b._fd).st_size == 2 * N  # and the server did not grow it back
    os.ftruncate(b._fd, 4 * N)
    assert _infer(srv, "in", "out")[0] == 200
    os.ftruncate(a._fd, 4 * N - 4)  # ... and its input region
    status, body = _infer(srv, "in", "out")
    assert status == 400 and f"is now {4 * N - 4} bytes, too small" in body["error"], body
    os.ftruncate(a._fd, 4 * N)
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


def test_by_default_inputs_are_copied_in_and_outputs_written_after_the_run(copying, region):
    srv, session = copying
    a, b = _in_out(srv, region)
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    for step in (1, 2):
        _floats(a)[:] = x * step
        status, body = _infer(srv, "in", "out")
        assert status == 200, body
        assert np.array_equal(_floats(b), (x * step)[:, ::-1])
    assert not getattr(session, "_bindings", None), "the runtime was bound to a region without shm_in_place"


def test_a_region_shrunk_while_requests_read_it_fails_those_requests_not_the_daemon(tmp_path, region):
    """A real daemon serving a [1, 150528] FP32 model (the bytes of a [1, 3, 224, 224] image); a thread truncates
    the input region to nothing and restores it in a loop while two clients infer from it."""
    import threading
    import time

    from support.daemon import Daemon, drop, write_config

    from agent.samples import tiny_model, write_package

    size = 3 * 224 * 224
    nbytes = 4 * size
    cfg = write_config(tmp_path / "dev")
    state = tmp_path / "dev" / "state"
    d = Daemon(cfg, state)
    a, b = region(nbytes), region(nbytes)
    try:
        d.wait_ready()
        drop(state, "1", writer=lambda p: write_package(p, tiny_model(1.0, size), name="tiny", version="1"))
        assert d.wait_deployment("1")["result"] == "committed", d.tail()
        srv = SimpleNamespace(port=int(d.url.rsplit(":", 1)[1]))  # what _post needs of a server
        for name, shm in (("in", a), ("out", b)):
            status, body = _post(
                srv, f"/v2/systemsharedmemory/region/{name}/register", {"key": "/" + shm.name, "byte_size": nbytes}
            )
            assert status == 200, body
        doc = {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, size],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": nbytes},
                }
            ],
            "outputs": [
                {"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": nbytes}}
            ],
        }
        stop, answers = threading.Event(), []

        def truncate():
            while not stop.is_set():
                os.ftruncate(a._fd, 0)
                time.sleep(0.001)
                os.ftruncate(a._fd, nbytes)
                time.sleep(0.001)

        def client():
            for _ in range(60):
                try:
                    answers.append(_post(srv, "/v2/models/tiny/infer", doc))
                except OSError as exc:  # the daemon gone: a connection refused or reset
                    answers.append((0, {"error": repr(exc)}))

        storm = threading.Thread(target=truncate)
        clients = [threading.Thread(target=client) for _ in range(2)]
        storm.start()
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        stop.set()
        storm.join(10)
        assert d.proc.poll() is None, d.tail()
        codes = sorted({status for status, _ in answers})
        assert set(codes) <= {200, 400}, [x for x in answers if x[0] not in (200, 400)][:3]
        refused = [body["error"] for status, body in answers if status == 400]
        assert refused and all("too small" in e for e in refused), refused[:3]

        x = np.linspace(-1, 1, size, dtype=np.float32)
        np.ndarray((size,), "<f4", a.buf)[:] = x  # later requests work, and are right
        status, body = _post(srv, "/v2/models/tiny/infer", doc)
        assert status == 200, body
        assert np.array_equal(np.ndarray((size,), "<f4", b.buf), x + np.float32(1.0))
    finally:
        assert d.terminate() == 0, d.tail()


def test_an_unregister_during_a_read_closes_the_descriptor_after_it(region):
    """A descriptor closed while a request preads it could be reused at once by another open file (a socket, the
    journal): the region's fd stays open until its last user is done."""
    from agent.serving.shm import SharedMemory

    shm = SharedMemory()
    a = region(4 * N)
    shm.register("in", "/" + a.name, 0, 4 * N)
    target = os.path.join("/dev/shm", a.name)
    with shm._held("in", 0, 4 * N, "test") as (held, _):
        shm.unregister("in")
        assert os.readlink(f"/proc/self/fd/{held.fd}") == target  # still open for the request using it
        assert shm.status() == []
    try:
        still = os.readlink(f"/proc/self/fd/{held.fd}")
    except OSError:
        still = None
    assert still != target
