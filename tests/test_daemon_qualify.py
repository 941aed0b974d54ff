"""The daemon keeps qualify's verdict: one qualification at a time, the declared shapes (warm-up replays them),
guessed shapes refused with what to add, a model over serving.memory_max refused while the previous serves."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import numpy as np
from support.daemon import Daemon, drop, infer, wait_for, write_config
from support.proc import status_bytes
from test_qualify_field import RANGE, hog_package, maxpool_model, scaled_model

from agent.samples import cnn_model, ml_model, sample_cnn_package, sample_ml_package, tiny_model, write_package

DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def _reshape_bare(path) -> None:
    """x: [n] reshaped to [-1, 4]: with n guessed as 1 no runtime can run it."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([-1, 4], np.int64), "shape")
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
        [shape],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    write_package(path, m, name="reshape", golden=False)


def _relu_bare(directory):
    """A model with symbolic dims and nothing in the package that says what they are."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C"])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return write_package(directory, m, name="relu", golden=False)


def _results(daemon: Daemon, names: list[str], timeout: float = 600.0) -> dict:
    def done():
        doc = daemon.status() or {}
        deps = doc.get("deployments") or {}
        if all((deps.get(n) or {}).get("result") for n in names) and not doc.get("in_flight"):
            return deps
        return None

    return wait_for(done, timeout, f"deployments of {names}", daemon.proc)


def _post(url: str, model: str, inputs: list[dict]) -> dict:
    body = json.dumps({"inputs": inputs}).encode()
    req = urllib.request.Request(
        f"{url}/v2/models/{model}/infer", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _same_as_onnxruntime(url: str, name: str, model, feeds: dict) -> None:
    """What the daemon serves equals plain onnxruntime on the same input."""
    import onnxruntime as ort

    inputs = [
        {"name": k, "shape": list(v.shape), "datatype": DATATYPES[v.dtype], "data": v.ravel().tolist()}
        for k, v in feeds.items()
    ]
    out = _post(url, name, inputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for o in out["outputs"]:
        got = np.asarray(o["data"]).reshape(o["shape"])
        assert got.shape == want[o["name"]].shape and np.allclose(got, want[o["name"]], rtol=1e-4, atol=1e-5), name


def _windows(log: str) -> list[tuple[str, str]]:
    """(model, start|end) in log order, from the daemon's qualify_start / qualify_end progress lines."""
    out = []
    for line in log.splitlines():
        m = re.search(r"\bmodel=(\S+).*progress=qualify_(start|end)", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def test_packages_dropped_together_qualify_one_at_a_time_on_their_declared_shapes(tmp_path):
    cfg = write_config(tmp_path)
    state = tmp_path / "state"
    d = Daemon(cfg, state, env={"EDGE_AGENT_QUALIFY_ISOLATE": "1"})
    writers = {
        "pool": lambda p: write_package(
            p, maxpool_model(), name="pool", golden=False, extra_yaml={"input_shapes": {"x": RANGE}}
        ),
        "relu": _relu_bare,
        "cnn": lambda p: sample_cnn_package(p, name="cnn"),
        "ml": lambda p: sample_ml_package(p, name="ml"),
        "scaled": lambda p: write_package(
            p,
            scaled_model(),
            name="scaled",
            golden=False,
            extra_yaml={"input_shapes": {"x": [1, 160]}, "input_values": {"sr": 16000}},
        ),
        "tiny": None,
        "reshape": _reshape_bare,
    }
    try:
        d.wait_ready()
        for name, writer in writers.items():
            drop(state, "1", name=name, writer=writer)
        deps = _results(d, list(writers))
        for name in ("pool", "cnn", "ml", "scaled", "tiny"):
            assert deps[name]["result"] == "committed", (name, deps[name], d.tail())
        relu = deps["relu"]
        assert relu["result"] == "failed" and "shapes guessed" in relu["reason"], relu
        assert "input 'x': N=1, C=1" in relu["reason"] and "input_shapes" in relu["reason"]
        assert ".py:" not in relu["reason"]
        # every provider fails on the guessed shapes: the fix leads, each runtime error is said once and short
        reshape = deps["reshape"]["reason"]
        fix = reshape.find("shapes guessed at qualification (input 'x': n=1)")
        assert 0 <= fix < reshape.find("add input_shapes") < reshape.find("on those shapes no provider passed: "), (
            reshape
        )
        assert len(reshape) < 900 and ".py:" not in reshape, reshape

        x = np.random.default_rng(3).standard_normal((1, 1, 32, 32)).astype(np.float32)
        out = _post(
            d.url, "pool", [{"name": "x", "shape": [1, 1, 32, 32], "datatype": "FP32", "data": x.ravel().tolist()}]
        )
        import onnxruntime as ort

        want = ort.InferenceSession(maxpool_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        got = np.asarray(out["outputs"][0]["data"], np.float32).reshape(out["outputs"][0]["shape"])
        assert got.shape == want.shape == (1, 1, 17, 17) and np.allclose(got, want)
        rng = np.random.default_rng(5)
        _same_as_onnxruntime(
            d.url, "cnn", cnn_model(), {"input": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
        )
        _same_as_onnxruntime(d.url, "ml", ml_model(), {"x": rng.standard_normal((1, 4)).astype(np.float32)})
        _same_as_onnxruntime(d.url, "tiny", tiny_model(1.0), {"x": rng.standard_normal((1, 4)).astype(np.float32)})
        x = rng.standard_normal((1, 160)).astype(np.float32)
        _same_as_onnxruntime(d.url, "scaled", scaled_model(), {"x": x, "sr": np.array(16000, np.int64)})

        log = d.log.read_text()
        assert "process died" not in log
        windows = _windows(log)
        assert len(windows) == 2 * len(writers), windows
        for i in range(0, len(windows), 2):  # start, end of the same model, never interleaved
            assert windows[i][1] == "start" and windows[i + 1] == (windows[i][0], "end"), windows
        spans = []
        for f in (state / "deployments").glob("*.json"):
            data = json.loads(f.read_text()).get("data", {})
            q = data.get("qualification")
            if q:
                spans.append((q["started"], q["finished"]))
                sel = data["selected"]  # a contended row is no baseline for probation
                baseline = data["probation"]["baseline"]  # a first deployment: judged on its qualified figures
                assert baseline["source"] is None if sel["contended"] else baseline["source"] == "qualified", data
        spans.sort()
        assert len(spans) == 5  # the refused one journals no window (it failed in qualifying)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        decisions = (json.loads(p.read_text()) for p in sorted((state / "decisions").glob("*.json")))
        decision = next(doc for doc in decisions if doc.get("selected"))  # a measured row of a committed model
        row = decision["results"][0]
        assert "contended" in row and "conditions" in row and "serving_rps" in row["conditions"]
        assert isinstance(row["memory_peak_bytes"], int)
        served_at = os.getpriority(os.PRIO_PROCESS, d.proc.pid)
        assert row["conditions"]["nice"] == min(19, served_at + 10)  # serving.build_nice below the daemon
    finally:
        assert d.terminate() == 0, d.tail()


def test_a_model_over_memory_max_is_refused_and_the_previous_version_keeps_serving(tmp_path):
    cfg = write_config(tmp_path, extra={"serving": {"host": "127.0.0.1", "port": 0, "memory_max": "1G"}})
    state = tmp_path / "state"
    d = Daemon(cfg, state, env={"EDGE_AGENT_QUALIFY_ISOLATE": "1"})
    try:
        d.wait_ready()
        drop(state, "1")
        assert d.wait_deployment("1")["result"] == "committed", d.tail()
        drop(state, "2", writer=lambda p: hog_package(p, 4.0, name="tiny", version="2"))
        dep = d.wait_deployment("2", timeout=600)
        assert dep["result"] == "failed" and "memory" in dep["reason"] and "1.0 GiB" in dep["reason"], dep
        assert infer(d.url, 1.0)[0] == "1"  # the previous version still serves
        hwm = status_bytes(d.proc.pid, "VmHWM")
        assert hwm < 1.5 * (1 << 30), hwm
        assert os.path.exists(state / "status.json")
    finally:
        assert d.terminate() == 0, d.tail()


def test_a_newer_version_supersedes_one_waiting_in_the_queue(tmp_path):
    import threading

    from support.agent import queue_holder
    from support.daemon import running_agent

    gen = running_agent(tmp_path)
    agent = next(gen)
    hold, held = threading.Event(), threading.Event()

    t = queue_holder(agent, hold, held, 120)  # someone else's qualification holds the device
    t.start()
    try:
        held.wait(30)
        drop(agent.state_dir, "1")
        wait_for(
            lambda: any(e.get("progress") == "queued" and e.get("version") == "1" for e in agent.events),
            60,
            "v1 queued",
        )
        assert agent.status()["qualification_queue"]["running"] == "other"
        drop(agent.state_dir, "2")

        def ended(version):
            deps = [d for d in agent.orchestrator.journal.all() if d.version == version and d.terminal]
            return deps[-1] if deps else None

        v1 = wait_for(lambda: ended("1"), 60, "v1 superseded")
        assert v1.state.value == "failed" and "superseded by version 2" in v1.reason
        assert "qualification" not in v1.data  # it never measured
        hold.set()
        v2 = wait_for(lambda: ended("2"), 120, "v2 committed")
        assert v2.state.value == "committed", v2.reason
        windows = [w["label"].split()[0:2] for w in agent.steps.qualify_queue.history]
        assert windows == [["other"], ["check", "tiny"], ["tiny", "2"]]  # v2's package check, then v2's measuring
    finally:
        hold.set()
        t.join(30)
        next(gen, None)
