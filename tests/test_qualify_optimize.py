"""Optimisation variants (agent.qualify.optimize): a transformer block made in code and a real third-party CNN,
each measured as delivered and after offline optimisation; the optimised graph is selected only when it passes
against the unoptimised fp32 graph and is faster beyond noise, refused with the first differing output when it
is out of tolerance; rows carry SQNR and cold/warm session times; the daemon serves the file that won."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnxruntime as ort
import optmodels
import pytest
import realmodels_pip as rp
import yaml
from support.agent import make_agent
from support.daemon import deploy

from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.qualify import optimize
from agent.qualify.decision import Row
from agent.qualify.harness import qualify
from agent.qualify.select import choose, is_near_tie
from agent.targets import get_target

PROFILE = HardwareProfile(arch="x86_64", os="Linux", cpu=CpuInfo(vendor="GenuineIntel", model="test", cores=2))
FAST = {"latency_budget_s": 0.2, "row_timeout_s": 300}


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    return optmodels.transformer_package(tmp_path_factory.mktemp("opt") / "block")


def _consistent(d) -> None:
    """An optimised row serves only when it beats the graph as delivered on its provider beyond noise."""
    by = {r.key: r for r in d.results}
    win = by[d.selected_key]
    assert d.graph["file"] == win.model_path and d.graph["why"]
    plain = by.get(win.provider)
    if win.optimization:
        assert d.graph["optimization"] == win.optimization and win.model_path.endswith(f"{win.optimization}.onnx")
        assert plain is None or plain.status != "passed" or not is_near_tie(win, plain), d.losers
    for key, why in d.losers.items():
        if (
            by[key].optimization
            and by[key].status == "passed"
            and not win.optimization
            and by[key].provider == win.provider
        ):
            assert "slower" in why or "graph as delivered serves" in why, why


def test_transformer_block_fusions_are_built_measured_and_judged(block, tmp_path):
    d = qualify(
        block, PROFILE, get_target("generic-x86_64"), providers=["cpu"], cache_dir=tmp_path, optimize=True, **FAST
    )
    built = {r["kind"]: r for r in d.optimizations}
    assert set(built) == set(optimize.KINDS)
    fused = onnx.load(built["fusions"]["file"])
    assert {"Attention", "LayerNormalization"} <= {n.op_type for n in fused.graph.node}  # the transformer fusions ran
    assert built["fusions"]["nodes"] < built["fusions"]["nodes_before"]
    measured = {r.variant for r in d.results}
    for kind, rec in built.items():  # a graph equal to the original's or an earlier kind's is not measured again
        assert (optimize.variant_name(None, kind) in measured) == bool(rec.get("changed")), rec
        if not rec.get("changed"):
            assert rec["same_as"]
    rows = {r.key: r for r in d.results}
    assert rows["cpu"].status == "passed" and rows["opt-fusions/cpu"].status == "passed", rows["opt-fusions/cpu"].reason
    fused_row = rows["opt-fusions/cpu"]
    assert fused_row.optimization == "fusions" and fused_row.accuracy["against"] == "fp32 original"
    assert fused_row.accuracy["sqnr_db"] > 60  # fused kernels change rounding only: SQNR per output is reported
    assert "sqnr_db" in fused_row.accuracy["outputs"]["y"]
    for r in d.results:
        assert r.session_s["cold_s"] > 0 and r.session_s["warm_s"] > 0 and r.session_s["cache"] == "none"
    _consistent(d)
    doc = json.loads(json.dumps(d.to_dict()))  # the decision record is plain JSON
    assert doc["graph"]["file"] and doc["optimizations"]


def test_an_optimised_graph_out_of_tolerance_is_refused_with_the_first_differing_output(tmp_path):
    pkg = optmodels.transformer_package(tmp_path / "strict")
    meta = yaml.safe_load((pkg / "model.yaml").read_text())
    meta["tolerances"] = {"max_abs": 0.0, "max_rel": 0.0, "min_cosine": 1.0}  # bit-exact: fusions reorder sums
    (pkg / "model.yaml").write_text(yaml.safe_dump(meta))
    d = qualify(
        pkg,
        PROFILE,
        get_target("generic-x86_64"),
        providers=["cpu"],
        cache_dir=tmp_path / "c",
        optimize=["fusions"],
        **FAST,
    )
    rows = {r.key: r for r in d.results}
    fused = rows["opt-fusions/cpu"]
    assert fused.status == "failed" and fused.stage == "accuracy"
    assert fused.reason.startswith(
        "refused: fusions changes the outputs beyond tolerance; first output that differs: y:"
    )
    assert fused.accuracy["sqnr_db"] is not None
    assert d.selected_key == "cpu" and d.graph["optimization"] is None and d.graph["file"] == str(pkg / "model.onnx")


def test_task_tolerances_judge_by_sqnr(block, tmp_path):
    base = get_target("generic-x86_64")
    target = dataclasses.replace(base, tasks={"embeddings": {"fp32": {"min_sqnr_db": 500.0}}})
    d = qualify(block, PROFILE, target, providers=["cpu"], cache_dir=tmp_path, optimize=["fusions"], **FAST)
    fused = next(r for r in d.results if r.optimization == "fusions")
    assert fused.status == "failed" and "sqnr" in fused.reason and "< 500.0 dB" in fused.reason
    assert fused.accuracy["tolerance"]["min_sqnr_db"] == 500.0
    assert d.selected_key == "cpu"  # identical outputs (no noise) pass any SQNR floor


def test_a_cold_start_budget_fails_rows_that_build_too_slowly(block, tmp_path):
    base = get_target("generic-x86_64")
    target = dataclasses.replace(base, qualify={"cold_start_budget_s": 1e-6})
    d = qualify(block, PROFILE, target, providers=["cpu"], cache_dir=tmp_path, **FAST)
    row = d.results[0]
    assert row.status == "failed" and row.stage == "cold_start" and "cold_start_budget_s 1e-06 s" in row.reason
    assert d.selected is None


def test_a_real_cnn_optimised_variants_are_judged_against_the_delivered_graph(tmp_path):
    try:
        pkg = rp.ocr_cls_package(tmp_path / "cls")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    d = qualify(
        pkg,
        PROFILE,
        get_target("generic-x86_64"),
        providers=["cpu", "openvino"],
        cache_dir=tmp_path / "c",
        optimize=["ort-extended", "slim"],
        **FAST,
    )
    rows = {r.key: r for r in d.results}
    assert {"cpu", "opt-ort-extended/cpu", "opt-slim/cpu"} <= set(rows)
    for key in ("opt-ort-extended/cpu", "opt-slim/cpu"):
        assert rows[key].status == "passed", rows[key].reason
        assert rows[key].accuracy["top1_agreement"] == 1.0 and rows[key].original["p50_ms"] > 0
    ov = [r for r in d.results if r.provider == "openvino" and r.status == "passed"]
    for r in ov:  # OpenVINO writes a compiled cache: cold is built without it, warm from the sealed one
        assert r.session_s["cache"] == "compiled" and r.session_s["cold_s"] > 0 and r.session_s["warm_s"] > 0
    _consistent(d)


def test_the_daemon_serves_the_graph_the_decision_names(block, tmp_path):
    from agent.lifecycle.slots import ModelSlots
    from agent.lifecycle.steps import StepConfig

    steps = StepConfig(
        probation_s=0.3, providers=["cpu"], qualify_options={"latency_budget_s": 0.2, "optimize": ["fusions"]}
    )
    agent = make_agent(tmp_path / "agent", step_config=steps)
    agent.start()
    try:
        import shutil

        dep = deploy(agent, "1", writer=lambda dst: shutil.copytree(block, dst), name="block")
        assert dep.state.value == "committed", dep.reason
        decision = json.loads((agent.state_dir / "decisions" / f"{dep.id}.json").read_text())
        served_file = decision["graph"]["file"]
        entry = ModelSlots(agent.state_dir).committed("block")
        assert entry["model_path"] == served_file
        assert entry["session_s"]["cold_s"] > 0 and entry["session_s"]["warm_s"] > 0
        assert decision["swap_timings"]["first_answer_s"] >= decision["swap_timings"]["session_s"] > 0
        from test_realmodels_daemon import infer

        x = np.random.default_rng(3).standard_normal((1, 32, 128)).astype(np.float32)
        got = infer(agent.url, "block", {"x": x})["y"]
        want = ort.InferenceSession(served_file, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        status = agent.status()
        assert status["models"]["block"]["session_s"]["cold_s"] > 0
        assert status["deployments"]["block"]["first_answer_s"] > 0
        if decision["graph"]["optimization"]:
            assert status["models"]["block"]["optimization"] == "fusions"
    finally:
        agent.stop()


def _row(key: str, p50: float, half_ci: float) -> Row:
    variant, _, provider = key.rpartition("/")
    return Row(
        provider=provider,
        status="passed",
        variant=variant or None,
        optimization=optimize.kind_of(variant or None),
        latency_ms={"p50": p50, "p99": p50 * 2, "p50_ci95": [p50 - half_ci, p50 + half_ci]},
    )


@pytest.mark.parametrize(
    "rows,winner,loser_says",
    [
        # faster beyond noise: the optimised graph serves
        ([("cpu", 10.0, 0.2), ("opt-fusions/cpu", 6.0, 0.2)], "opt-fusions/cpu", "slower: p50 10 ms"),
        # within noise of the graph as delivered: the delivered graph serves
        ([("cpu", 10.0, 0.2), ("opt-fusions/cpu", 9.9, 0.2)], "cpu", "graph as delivered serves"),
        # openvino wins on preference through its variant's near-tie with the noisy fastest row; the delivered
        # graph, within noise of that variant (but not of the fastest row), serves on openvino
        (
            [("cpu", 4.6, 7.5), ("openvino", 12.5, 0.05), ("opt-slim/openvino", 12.0, 0.1)],
            "openvino",
            "graph as delivered serves",
        ),
    ],
)
def test_selection_serves_an_optimised_graph_only_when_faster_beyond_noise(rows, winner, loser_says):
    made = [_row(*r) for r in rows]
    won, why, losers = choose(made, ["openvino", "cpu"])
    assert won.key == winner, (why, losers)
    opt_keys = [r.key for r in made if r.optimization and r.key != winner]
    assert any(loser_says in losers[k] for k in opt_keys or list(losers)), losers
