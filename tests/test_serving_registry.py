"""ModelRegistry: validation, stats, make-before-break drain, stop-then-start, deactivate (real cpu sessions)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.serving import GatedSession, log_model, open_session, reshape_model, x4

from agent.errors import ServingError
from agent.samples import cnn_model, tiny_model
from agent.serving.errors import InferenceFailed, InvalidInput, ModelUnavailable, NotFound, status_of
from agent.serving.registry import ModelRegistry


@pytest.fixture
def reg(tmp_path):
    r = ModelRegistry(drain_timeout=20)
    r.activate("tiny", "1", open_session(tiny_model(1.0), tmp_path, "t1.onnx"), {"provider": "cpu"})
    r.activate("cnn", "7", open_session(cnn_model(), tmp_path, "cnn.onnx"))
    yield r
    r.close()


def test_infer_returns_version_and_outputs(reg):
    version, out = reg.infer("tiny", x4(2.0))
    assert version == "1"
    np.testing.assert_array_equal(out["y"], np.full((1, 4), 3.0, np.float32))
    assert reg.models() == {"tiny": "1", "cnn": "7"}


def test_dynamic_batch_dim_accepted_and_outputs_selectable(reg):
    version, out = reg.infer(
        "cnn", {"input": np.zeros((3, 3, 32, 32), np.float32)}, version="7", outputs=["probabilities"]
    )
    assert version == "7" and out["probabilities"].shape == (3, 10)


@pytest.mark.parametrize(
    "feeds, fragment",
    [
        ({"x": np.zeros((1, 5), np.float32)}, "shape [1, 5]"),
        ({"x": np.zeros((4,), np.float32)}, "shape [4]"),
        ({"x": np.zeros((1, 4), np.float64)}, "datatype FP64"),
        ({"z": np.zeros((1, 4), np.float32)}, "unknown input(s) ['z']"),
        ({}, "missing input(s) ['x']"),
        ({"x": [[0.0] * 4]}, "numpy array"),
    ],
)
def test_bad_feeds_rejected_before_the_runtime(reg, feeds, fragment):
    before = reg.stats("tiny")
    with pytest.raises(InvalidInput) as info:
        reg.infer("tiny", feeds)
    assert fragment in str(info.value) and status_of(info.value) == 400
    after = reg.stats("tiny")
    assert after["requests"] == before["requests"] and after["rejected"] == before["rejected"] + 1


def test_unknown_model_version_and_output(reg):
    with pytest.raises(NotFound, match="not loaded"):
        reg.infer("nope", x4())
    with pytest.raises(NotFound, match="version 2 is not loaded"):
        reg.infer("tiny", x4(), version="2")
    with pytest.raises(InvalidInput, match="no output"):
        reg.infer("tiny", x4(), outputs=["nope"])
    assert issubclass(NotFound, ServingError)


def test_stats_count_and_percentiles(reg):
    for _ in range(70):
        reg.infer("tiny", x4())
    s = reg.stats("tiny")
    assert s["requests"] == 70 and s["errors"] == 0 and s["latency_samples"] == 70
    assert 0 < s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"]


def test_nan_outputs_counted(tmp_path):
    r = ModelRegistry()
    r.activate("log", "1", open_session(log_model(), tmp_path))
    r.infer("log", x4(1.0))
    _, out = r.infer("log", x4(-1.0))
    assert np.isnan(out["y"]).all()
    assert r.stats("log")["nonfinite"] == 1 and r.stats("log")["requests"] == 2


def test_runtime_failure_is_inference_failed_and_counted(tmp_path):
    r = ModelRegistry()
    r.activate("rs", "1", open_session(reshape_model(), tmp_path))
    _, ok = r.infer("rs", {"x": np.ones((1, 4), np.float32), "shape": np.array([2, 2], np.int64)})
    assert ok["y"].shape == (2, 2)
    with pytest.raises(InferenceFailed) as info:
        r.infer("rs", {"x": np.ones((1, 4), np.float32), "shape": np.array([3, 3], np.int64)})
    assert status_of(info.value) == 500
    assert r.stats("rs")["errors"] == 1


def test_make_before_break_drains_the_in_flight_request(tmp_path):
    r = ModelRegistry(drain_timeout=30)
    old = GatedSession(open_session(tiny_model(1.0), tmp_path, "v1.onnx"))
    r.activate("m", "1", old)
    result = {}
    t = threading.Thread(target=lambda: result.update(v=r.infer("m", x4())))
    t.start()
    assert old.entered.wait(10)
    swap_done = {}
    new = open_session(tiny_model(2.0), tmp_path, "v2.onnx")
    swapped = threading.Event()
    s = threading.Thread(
        target=lambda: swap_done.update(
            r.activate("m", "2", new, progress=lambda e, **f: swapped.set() if e == "swapped" else None)
        )
    )
    s.start()
    # the new version serves while the old request is still in flight, and the old session stays open
    assert swapped.wait(30)
    assert r.infer("m", x4())[0] == "2"
    assert not old.closed.is_set()
    old.gate.set()
    t.join(10)
    s.join(10)
    version, out = result["v"]
    assert version == "1" and out["y"][0, 0] == 1.0
    assert old.closed.is_set()
    assert swap_done["previous"] == "1" and swap_done["drained"] is True


def test_drain_timeout_closes_when_the_last_request_leaves(tmp_path):
    r = ModelRegistry()
    old = GatedSession(open_session(tiny_model(1.0), tmp_path, "v1.onnx"))
    r.activate("m", "1", old)
    t = threading.Thread(target=r.infer, args=("m", x4()))
    t.start()
    assert old.entered.wait(10)
    info = r.activate("m", "2", open_session(tiny_model(2.0), tmp_path, "v2.onnx"), drain_timeout=0.05)
    assert info["drained"] is False and not old.closed.is_set()
    old.gate.set()
    t.join(10)
    assert old.closed.is_set()


def test_stop_then_start_closes_old_before_building_new(tmp_path):
    r = ModelRegistry()
    old = GatedSession(open_session(tiny_model(1.0), tmp_path, "v1.onnx"))
    old.gate.set()
    r.activate("m", "1", old)
    seen = {}

    def build():
        seen["old_closed"] = old.closed.is_set()
        with pytest.raises(ModelUnavailable):
            r.infer("m", x4())
        seen["ready"] = r.ready()
        return open_session(tiny_model(2.0), tmp_path, "v2.onnx")

    info = r.activate("m", "2", build, swap="stop-then-start")
    assert seen == {"old_closed": True, "ready": False}
    assert info["previous"] == "1" and info["swap"] == "stop-then-start"
    assert r.infer("m", x4())[0] == "2" and r.ready()


def test_failed_factory_leaves_model_unloaded_not_stuck(tmp_path):
    r = ModelRegistry()
    r.activate("m", "1", open_session(tiny_model(1.0), tmp_path))

    def broken():
        raise ServingError("compile failed")

    with pytest.raises(ServingError, match="compile failed"):
        r.activate("m", "2", broken, swap="stop-then-start")
    with pytest.raises(NotFound):
        r.infer("m", x4())
    assert r.ready()


def test_deactivate_and_unknown_swap_mode(reg):
    info = reg.deactivate("tiny")
    assert info["previous"] == "1" and info["drained"]
    assert "tiny" not in reg.models()
    with pytest.raises(NotFound):
        reg.deactivate("tiny")
    with pytest.raises(InvalidInput, match="swap mode"):
        reg.activate("cnn", "8", object(), swap="yolo")


def test_activate_reports_progress(tmp_path):
    r = ModelRegistry()
    events = []
    first = r.activate(
        "m", "1", open_session(tiny_model(1.0), tmp_path, "a.onnx"), progress=lambda e, **f: events.append((e, f))
    )
    assert first["previous"] is None and first["drained"] is True
    r.activate(
        "m",
        "2",
        lambda: open_session(tiny_model(2.0), tmp_path, "b.onnx"),
        progress=lambda e, **f: events.append((e, f)),
    )
    assert [e for e, _ in events] == ["swapped", "building", "swapped", "released"]
    assert events[-1][1] == {"model": "m", "version": "1", "drained": True}


def test_finite_checks_every_response_first_and_on_probation_then_sampled(tmp_path):
    from agent.serving.metrics import FINITE_FIRST
    from agent.trial.probation import Probation

    r = ModelRegistry(finite_every=4)
    r.activate("log", "1", open_session(log_model(), tmp_path))
    nan = x4(-1.0)  # log(-1): every response is NaN, so each check counts one
    for _ in range(FINITE_FIRST):
        r.infer("log", nan)
    s = r.stats("log")
    assert s["finite_checked"] == s["nonfinite"] == FINITE_FIRST
    for _ in range(40):
        r.infer("log", nan)
    s = r.stats("log")
    assert s["finite_checked"] == s["nonfinite"] == FINITE_FIRST + 10  # one in 4 after the first ones
    watch = Probation(r, "log", "1", None, window=60)  # a probation watches: every response again
    for _ in range(8):
        r.infer("log", nan)
    assert r.stats("log")["finite_checked"] == FINITE_FIRST + 18
    assert watch.evaluate().state == "trouble"
    watch.stop()
    for _ in range(8):
        r.infer("log", nan)
    assert r.stats("log")["finite_checked"] == FINITE_FIRST + 20
    with pytest.raises(InvalidInput):
        ModelRegistry(finite_every=0)


def test_swaps_race_lock_free_holds_without_a_failure_or_a_leak(tmp_path):
    """8 threads infer while 150 swaps retire sessions: every request succeeds on the version that took it
    (y = x + version: a closed or mixed-up session would fail or answer wrong), every retired session closes."""
    sessions = [open_session(tiny_model(float(v)), tmp_path, f"t{v}.onnx") for v in range(2)]
    reg_ = ModelRegistry(drain_timeout=30)
    entries = []
    reg_.activate("m", "0", sessions[0])
    entries.append(reg_._entries["m"])
    stop, bad, done = threading.Event(), [], [0] * 8

    def client(i):
        while not stop.is_set():
            try:
                version, out = reg_.infer("m", x4(1.0))
                if not np.allclose(out["y"], 1.0 + int(version) % 2):
                    bad.append(f"version {version} answered {out['y']}")
            except Exception as exc:  # noqa: BLE001 - any failure is the bug under test
                bad.append(repr(exc))
            done[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        for v in range(1, 151):
            fresh = open_session(tiny_model(float(v % 2)), tmp_path, f"t{v % 2}.onnx")
            info = reg_.activate("m", str(v), fresh)
            entries.append(reg_._entries["m"])
            assert info["drained"], info
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert bad == [] and sum(done) > 150
    assert all(e.closed and not e.holds for e in entries[:-1]) and not entries[-1].closed
    for s in sessions:
        s.close()
    reg_.close()


def test_domain_errors_carry_no_http_status_and_one_map_gives_it():
    """The registry raises domain errors; status_of (called by the HTTP transport) is the one HTTP map, and every
    serving error class has its place in it (none carries a status of its own)."""
    import inspect

    from agent.errors import ServingError
    from agent.serving import errors
    from agent.serving.errors import HTTP_STATUS, InvalidInput, ModelNotFound, ServerBusy

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, ServingError)]
    assert not [c for c in classes if "status" in vars(c)]
    assert [c for c in classes if c is not ServingError and status_of(c.__new__(c)) == 500] == [InferenceFailed]
    assert not hasattr(InvalidInput("x"), "status") and not hasattr(ModelNotFound("x"), "status")
    got = [status_of(e) for e in (InvalidInput("x"), ModelNotFound("x"), ModelUnavailable("x"), ServerBusy("x"))]
    assert got == [400, 404, 503, 503]
    assert (status_of(InferenceFailed("x")), status_of(ServingError("x")), status_of(ValueError("x"))) == (500,) * 3
    assert HTTP_STATUS[errors.TooManyFailures] == 429 and HTTP_STATUS[errors.AlreadyExists] == 409
    r = ModelRegistry()
    with pytest.raises(ModelNotFound):
        r.infer("nothing", {})


def test_grpc_maps_the_same_domain_errors_at_its_edge():
    """The gRPC front maps the same classes (no HTTP status in between); anything else is INTERNAL."""
    grpc = pytest.importorskip("grpc")
    from agent.serving import errors
    from agent.serving.grpc.status import code_of

    assert code_of(errors.ModelNotFound("x")) == grpc.StatusCode.NOT_FOUND
    assert code_of(errors.InvalidInput("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(errors.TooManyFailures("x", retry_after=1.0)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_of(errors.Unsupported("x")) == grpc.StatusCode.UNIMPLEMENTED
    assert code_of(errors.InferenceFailed("x")) == grpc.StatusCode.INTERNAL
    assert code_of(ValueError("x")) == grpc.StatusCode.INTERNAL
