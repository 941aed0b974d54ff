"""Qualification that carries over to the device: declared shapes (fixed, min/opt/max), guessed shapes named,
memory measured and bounded per worker, the runner's real failures, the conditions each row ran under."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ModelError
from agent.hardware import detect
from agent.isolate.runner import FAULT_ENV, IsolatedWorker
from agent.package.load import load_package
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.samples import write_package

PROFILE = detect("/")
FAST = QualifyOptions(latency_budget_s=0.2)
RANGE = {"min": [1, 1, 2, 2], "opt": [1, 1, 32, 32], "max": [1, 1, 64, 64]}


def maxpool_model():
    """Pad reflect + MaxPool k=2 over a dynamic H x W (an OCR detector's stem): fails at H = W = 1, the value
    a bare model gets by default (ORT: "Pad reflect requires axis length >= 2"; OpenVINO: the kernel check)."""
    from onnx import TensorProto, helper

    pads = helper.make_tensor("pads", TensorProto.INT64, [8], [0, 0, 1, 1, 0, 0, 1, 1])
    graph = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
            helper.make_node("MaxPool", ["padded"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
        ],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, None, None])],
        [pads],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def scaled_model():
    """y = x * sr (a scalar sample-rate input that must not be 0) over a dynamic length."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "srf"], ["y"])],
        "scaled",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T"]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T"])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def hog_model(gib: float):
    """x [1, 4] -> Expand to [rows, 4] (`gib` GiB of float32 per inference) -> ReduceSum over rows: [1, 4]."""
    from onnx import TensorProto, helper

    rows = int(gib * (1 << 30) / 16)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [rows, 4])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["big"]), helper.make_node("ReduceSum", ["big", "axes"], ["y"])],
        "hog",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [shape, axes],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m, rows


def hog_package(directory: Path, gib: float, *, name: str = "hog", version: str = "1") -> Path:
    """The hog with golden data written from the arithmetic (running it to get them would need the memory)."""
    from onnx import numpy_helper

    model, rows = hog_model(gib)
    write_package(directory, model, name=name, version=version, golden=False)
    ds = directory / "test_data_set_0"
    ds.mkdir()
    x = np.full((1, 4), 0.5, np.float32)
    (ds / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    y = (x * rows).astype(np.float32)
    (ds / "output_0.pb").write_bytes(numpy_helper.from_array(y, "y").SerializeToString())
    return directory


# ---- shapes ---------------------------------------------------------------------------------------------------


def test_bare_model_names_its_assumed_dims_and_fails_where_dim_1_is_wrong(tmp_path):
    path = tmp_path / "pool.onnx"
    import onnx

    onnx.save(maxpool_model(), str(path))
    events = []
    d = qualify(path, PROFILE, providers=["cpu"], options=FAST, progress=lambda e, **f: events.append((e, f)))
    assert d.assumed_shapes == {"x": {"H": 1, "W": 1}}
    warnings = [f["reason"] for e, f in events if e == "warning"]
    assert len(warnings) == 1 and "x: H=1, W=1" in warnings[0] and "input_shapes" in warnings[0]
    assert "\n" not in warnings[0]
    row = d.row("cpu")
    assert row.status != "passed" and row.assumed_shapes == {"x": {"H": 1, "W": 1}}
    assert "reflect" in row.reason and "measured on assumed shapes x: H=1, W=1" in row.reason
    for reason in (row.reason, d.reason, *d.losers.values()):  # no source location in any reason
        assert not re.search(r"\.(py|cpp|cc|h):\d+", reason), reason


def test_declared_range_measures_opt_and_max_and_assumes_nothing(tmp_path):
    pkg = write_package(
        tmp_path / "pool", maxpool_model(), name="pool", golden=False, extra_yaml={"input_shapes": {"x": RANGE}}
    )
    d = qualify(pkg, PROFILE, providers=["cpu"], options=FAST)
    row = d.row("cpu")
    assert row.status == "passed", row.reason
    assert d.assumed_shapes == {} and row.assumed_shapes == {}
    assert "declared shapes" in d.inputs
    assert row.latency_ms["runs"] > 0 and row.latency_max_ms and row.latency_max_ms["runs"] > 0
    assert "samples_ms" not in row.to_dict()["latency_max_ms"]
    assert row.memory_peak_bytes is not None and row.memory_peak_bytes >= 0
    assert set(row.conditions) >= {"loadavg", "nice", "cpu_count", "others_cpu_share", "own_wait_share", "throttled"}
    assert isinstance(row.contended, bool)


def test_golden_data_for_accuracy_and_the_declared_opt_for_latency(tmp_path):
    from agent.package.inputs import package_plan

    feeds = {"x": np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)}
    pkg = load_package(
        write_package(tmp_path / "p", maxpool_model(), name="p", feeds=feeds, extra_yaml={"input_shapes": {"x": RANGE}})
    )
    plan = package_plan(pkg)
    assert plan.accuracy["x"].shape == (1, 1, 8, 8) and plan.expected is not None
    assert plan.latency["x"].shape == (1, 1, 32, 32) and plan.at_max["x"].shape == (1, 1, 64, 64)
    assert [s["x"].shape for s in plan.warm_sets()] == [(1, 1, 8, 8), (1, 1, 32, 32), (1, 1, 64, 64)]
    assert plan.assumed == {}


def test_input_values_give_scalar_inputs_their_value(tmp_path):
    from agent.package.inputs import package_plan

    meta = {"input_shapes": {"x": [1, 160]}, "input_values": {"sr": 16000}}
    pkg = load_package(write_package(tmp_path / "s", scaled_model(), name="s", golden=False, extra_yaml=meta))
    plan = package_plan(pkg)
    assert plan.accuracy["sr"].shape == () and int(plan.accuracy["sr"]) == 16000
    assert plan.assumed == {}
    d = qualify(pkg, PROFILE, providers=["cpu"], options=FAST)
    assert d.row("cpu").status == "passed"


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"x": {"min": [1, 1, 8, 8], "opt": [1, 1, 4, 4]}}, "min <= opt <= max"),
        ({"x": {"opt": [1, 1, 4]}}, "rank 3"),
        ({"x": [2, 1, 4, 4]}, "fixes it at 1"),
        ({"nope": [1]}, "no input 'nope'"),
        ({"x": {"best": [1, 1, 4, 4]}}, "opt required"),
        ({"x": [1, 1, -4, 4]}, "non-negative"),
    ],
)
def test_bad_declared_shapes_are_refused_with_the_key(tmp_path, shapes, message):
    pkg = write_package(
        tmp_path / "bad", maxpool_model(), name="bad", golden=False, extra_yaml={"input_shapes": shapes}
    )
    with pytest.raises(ModelError, match="input_shapes") as err:
        load_package(pkg)
    assert message in str(err.value)


# ---- memory ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gib", [4.0, 2.0])
def test_a_model_over_memory_max_fails_with_both_figures_and_only_its_worker_dies(tmp_path, gib):
    """4 GiB: the allocation is refused under RLIMIT_DATA; 2 GiB: the RSS watchdog kills the worker."""
    import psutil

    before = psutil.Process().memory_info().rss
    pkg = hog_package(tmp_path / "hog", gib)
    d = qualify(pkg, PROFILE, providers=["cpu"], options=replace(FAST, memory_max=1 << 30))
    row = d.row("cpu")
    assert d.selected is None and row.status == "failed" and row.stage == "memory", row.reason
    assert row.reason.startswith("memory:") and "1.0 GiB" in row.reason
    assert psutil.Process().memory_info().rss - before < 256 << 20  # the caller never held the model's memory


def test_memory_peak_is_reported_and_checked_against_the_cap(tmp_path):
    pkg = hog_package(tmp_path / "hog", 0.25)
    ok = qualify(pkg, PROFILE, providers=["cpu"], options=FAST).row("cpu")
    assert ok.status == "passed", ok.reason
    assert ok.memory_peak_bytes > 200 << 20  # a 256 MiB buffer per inference
    small = qualify(pkg, PROFILE, providers=["cpu"], options=replace(FAST, memory_max=64 << 20)).row("cpu")
    assert small.status == "failed" and small.stage == "memory"
    assert "> serving.memory_max 64 MiB" in small.reason


def test_sizes_parse_and_memory_max_resolves():
    from agent.serving.memory import mem_total, resolve_memory_max
    from agent.util.sizes import parse_size

    assert parse_size("512M") == 512 << 20 and parse_size("2G") == 2 << 30 and parse_size(1000) == 1000
    assert parse_size("1.5G") == 3 << 29 and parse_size("50%", total=1000) == 500
    for bad in ("lots", "-1G", 0, True, "50%"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert resolve_memory_max(1 << 30, {"memory_max": "2G"}) == (1 << 30, "serving.memory_max")
    assert resolve_memory_max(None, {"memory_max": "2G"})[0] == 2 << 30
    cap, why = resolve_memory_max(None, {})
    assert cap is not None and cap <= int(mem_total() * 0.8) and ("MemAvailable" in why or "cgroup" in why), why


def test_config_memory_max_key(tmp_path):
    from agent.config import load_config
    from agent.errors import ConfigError

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"device_id: d\nstate_dir: {tmp_path}/s\nserving: {{memory_max: 512M}}\n")
    assert load_config(cfg).serving.memory_max == 512 << 20
    cfg.write_text(f"device_id: d\nstate_dir: {tmp_path}/s\nserving: {{memory_max: plenty}}\n")
    with pytest.raises(ConfigError, match="serving.memory_max"):
        load_config(cfg)


# ---- the runner ---------------------------------------------------------------------------------------------


def test_a_worker_that_exits_0_without_a_result_reports_its_exit_and_stderr(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "exit0:quiet")
    with IsolatedWorker() as w:
        res = w.call("os:getpid", {}, timeout=60, tag="quiet")
    assert not res.ok and res.kind == "crashed"
    assert "exited with code 0" in res.error and "test fault: leaving without a result" in res.error


def test_a_result_sent_just_before_the_worker_exits_is_read(monkeypatch):
    """The daemon's old runner lost this one ("qualification process died (exit status 0)")."""
    monkeypatch.setenv(FAULT_ENV, "exit-after:done")
    for _ in range(5):
        with IsolatedWorker() as w:
            res = w.call(
                "agent.package.caches:runtime_key", {"provider": "cpu", "versions": {}}, timeout=60, tag="done"
            )
        assert res.ok and res.value.startswith("cpu-"), res.error


def test_a_large_result_arrives_whole_and_the_child_runs_niced():
    with IsolatedWorker(nice=7) as w:
        big = w.call("numpy:ones", {"shape": (4 << 20,), "dtype": "uint8"}, timeout=60)
        nice = w.call("os:getpriority", {"which": 0, "who": 0}, timeout=60)
    assert big.ok and big.value.nbytes == 4 << 20
    import os

    assert nice.ok and nice.value >= os.getpriority(os.PRIO_PROCESS, 0) + 7 or nice.value == 19


def test_exceptions_carry_no_source_location():
    from agent.isolate.runner import run_isolated

    res = run_isolated("agent.package.load:load_package", {"path": "/nonexistent"}, timeout=60)
    assert not res.ok and "ModelError" in res.error and ".py:" not in res.error


def test_check_cancels_a_running_call(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "hang:slow")

    class Stop(Exception):
        pass

    calls = []

    def check():
        calls.append(1)
        if len(calls) > 3:
            raise Stop

    with IsolatedWorker() as w:
        with pytest.raises(Stop):
            w.call("os:getpid", {}, timeout=120, tag="slow", check=check)
        assert w.call("os:getpid", {}, timeout=60).ok  # a fresh worker after the kill


def test_qualify_cli_warns_once_and_takes_memory_max(tmp_path):
    import json
    import subprocess
    import sys

    import onnx

    path = tmp_path / "pool.onnx"
    onnx.save(maxpool_model(), str(path))
    run = [sys.executable, "-m", "agent", "qualify", str(path), "--provider", "cpu", "--budget", "0.2"]
    p = subprocess.run([*run, "--json", "--memory-max", "2G"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stderr  # nothing passes at the assumed 1x1
    doc = json.loads(p.stdout)
    assert doc["assumed_shapes"] == {"x": {"H": 1, "W": 1}} and doc["memory_max"] == 2 << 30
    lines = [json.loads(ln).get("line") or "" for ln in p.stderr.splitlines() if ln.startswith("{")]  # --json
    warnings = [ln for ln in lines if ln.startswith("warning: shapes assumed (x: H=1, W=1)")]
    assert len(warnings) == 1
    bad = subprocess.run([*run, "--memory-max", "lots"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error: --memory-max:"), bad.stderr  # no progress
