"""Optimisation variants (agent.qualify.optimize): a transformer block made in code and a real third-party CNN,
each measured as delivered and after offline optimisation; the optimised graph is selected only when it passes
against the unoptimised fp32 graph and is faster beyond noise, refused with the first differing output when it
is out of tolerance; rows carry SQNR and cold/warm session times; the daemon serves the file that won."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

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
from agent.qualify.options import QualifyOptions
from agent.qualify.select import choose, is_near_tie
from agent.targets import ProviderPref, get_target

PROFILE = HardwareProfile(arch="x86_64", os="Linux", cpu=CpuInfo(vendor="GenuineIntel", model="test", cores=2))
FAST = QualifyOptions(latency_budget_s=0.2, row_timeout_s=300)


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
        block,
        PROFILE,
        get_target("generic-x86_64"),
        providers=["cpu"],
        options=replace(FAST, cache_dir=tmp_path, optimize=True),
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
        options=replace(FAST, cache_dir=tmp_path / "c", optimize=["fusions"]),
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
    d = qualify(
        block, PROFILE, target, providers=["cpu"], options=replace(FAST, cache_dir=tmp_path, optimize=["fusions"])
    )
    fused = next(r for r in d.results if r.optimization == "fusions")
    assert fused.status == "failed" and "sqnr" in fused.reason and "< 500.0 dB" in fused.reason
    assert fused.accuracy["tolerance"]["min_sqnr_db"] == 500.0
    assert d.selected_key == "cpu"  # identical outputs (no noise) pass any SQNR floor


def _offline_only():
    """generic-x86_64 with ORT's online graph optimisation off on cpu (ORT's advice for start-up: optimise offline,
    load with optimisation disabled): what an offline-optimised graph saves is then paid on every run of the graph
    as delivered, and nothing at session creation hides it."""
    base = get_target("generic-x86_64")
    return dataclasses.replace(base, providers=(ProviderPref("cpu", {"graph_optimization_level": "disable"}),))


def _rule(plain: Row, optimised: Row) -> Row:
    """Which of the graph as delivered and an optimised graph on one provider the selection rule serves, from
    their measured figures: the optimised one only when it is faster beyond noise (not a near-tie)."""
    lat = lambda r: (r.latency_ms["p50"], r.latency_ms["p99"])  # noqa: E731
    return optimised if lat(optimised) < lat(plain) and not is_near_tie(optimised, plain) else plain


def test_offline_folding_is_selected_where_faster_and_refused_where_not(tmp_path):
    """A block whose weights are computed in the graph (factored, as an export without constant folding leaves
    them) on a target that loads graphs unoptimised: the delivered graph rebuilds every weight on every run, the
    ort-basic graph has them folded. The measured rows decide through the rule; the same rows, the other way
    round, show the refusal; the wall time itself is never asserted on."""
    factor = 512
    assert optmodels.factored_macs(factored=factor) > 10 * optmodels.block_macs()  # the work folding removes
    pkg = optmodels.transformer_package(tmp_path / "factored", factored=factor, sets=2)
    d = qualify(
        pkg,
        PROFILE,
        _offline_only(),
        providers=["cpu"],
        options=replace(FAST, cache_dir=tmp_path / "c", optimize=["ort-basic"]),
    )
    built = d.optimizations[0]
    assert built["kind"] == "ort-basic" and built["changed"] and built["nodes"] < built["nodes_before"], built
    graph = onnx.load(built["file"]).graph
    consts = {i.name for i in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "MatMul" and set(n.input) <= consts]  # weights folded
    rows = {r.key: r for r in d.results}
    plain, folded = rows["cpu"], rows["opt-ort-basic/cpu"]
    assert plain.status == "passed" and folded.status == "passed", (plain.reason, folded.reason)
    assert plain.options == {"graph_optimization_level": "disable"}
    assert folded.optimization == "ort-basic" and folded.accuracy["against"] == "fp32 original"
    assert "sqnr_db" in folded.accuracy and "sqnr_db" in folded.accuracy["outputs"]["y"]
    assert folded.original and folded.original["p50_ms"] > 0 and folded.original["speedup"] > 0
    for r in (plain, folded):
        assert r.session_s["cold_s"] > 0 and r.session_s["warm_s"] > 0, r.session_s
    want = _rule(plain, folded)
    assert d.selected_key == want.key, (d.reason, d.losers, plain.latency_ms, folded.latency_ms)
    if want is folded:  # faster beyond noise and within tolerance: the folded graph serves, and the daemon its file
        assert d.graph["optimization"] == "ort-basic" and d.graph["file"] == built["file"], d.graph
        assert "within tolerance of the unoptimised fp32 graph and selected on latency" in d.graph["why"]
        assert d.losers["cpu"].startswith("slower: p50"), d.losers
    else:
        assert d.graph["optimization"] is None and d.graph["file"] == str(pkg / "model.onnx"), d.graph
    # The same measured rows the other way round: the optimised graph carrying the slower measurement is
    # refused, the graph as delivered serves; carrying the same measurement (a near-tie), it is refused too.
    fast, slow = sorted((plain.latency_ms, folded.latency_ms), key=lambda lat: (lat["p50"], lat["p99"]))
    reverse = [dataclasses.replace(plain, latency_ms=fast), dataclasses.replace(folded, latency_ms=slow)]
    won, _, losers = choose(reverse, ["cpu"])
    assert won.key == "cpu" and won.optimization is None, losers
    tie = is_near_tie(reverse[0], reverse[1])
    assert ("graph as delivered serves" if tie else "slower: p50") in losers["opt-ort-basic/cpu"], losers
    level = [dataclasses.replace(plain, latency_ms=slow), dataclasses.replace(folded, latency_ms=slow)]
    won, why, losers = choose(level, ["cpu"])
    assert won.key == "cpu" and "graph as delivered serves" in losers["opt-ort-basic/cpu"], (why, losers)


def test_a_cold_start_budget_fails_rows_that_build_too_slowly(block, tmp_path):
    base = get_target("generic-x86_64")
    target = dataclasses.replace(base, qualify={"cold_start_budget_s": 1e-6})
    d = qualify(block, PROFILE, target, providers=["cpu"], options=replace(FAST, cache_dir=tmp_path))
    row = d.results[0]
    assert row.status == "failed" and row.stage == "cold_start" and "cold_start_budget_s 1e-06 s" in row.reason
    assert d.selected is None


def test_a_real_cnn_optimised_variants_are_judged_against_the_delivered_graph(tmp_path):
    """PP-OCR's text-direction classifier (566 nodes: unfused BatchNormalization, 308 Constant nodes): on each
    provider the selection function, given the measured rows, serves an optimised graph only where the rule
    (faster beyond noise than the graph as delivered) says so."""
    try:
        pkg = rp.ocr_cls_package(tmp_path / "cls")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    d = qualify(
        pkg,
        PROFILE,
        get_target("generic-x86_64"),
        providers=["cpu", "openvino"],
        options=replace(FAST, cache_dir=tmp_path / "c", optimize=["ort-extended", "slim"]),
    )
    rows = {r.key: r for r in d.results}
    assert {"cpu", "opt-ort-extended/cpu", "opt-slim/cpu"} <= set(rows)
    for key in ("opt-ort-extended/cpu", "opt-slim/cpu"):
        assert rows[key].status == "passed", rows[key].reason
        assert rows[key].accuracy["top1_agreement"] == 1.0 and rows[key].original["p50_ms"] > 0
    ov = [r for r in d.results if r.provider == "openvino" and r.status == "passed"]
    for r in ov:  # OpenVINO writes a compiled cache: cold is built without it, warm from the sealed one
        assert r.session_s["cache"] == "compiled" and r.session_s["cold_s"] > 0 and r.session_s["warm_s"] > 0
    for provider in ("cpu", "openvino"):  # on each provider, the rule between the delivered and the fastest graph
        plain = rows.get(provider)
        opts = [r for r in d.results if r.provider == provider and r.optimization and r.status == "passed"]
        if not plain or plain.status != "passed" or not opts:
            continue
        best = min(opts, key=lambda r: (r.latency_ms["p50"], r.latency_ms["p99"]))
        won, _, losers = choose([plain, *opts], [provider])
        assert won.key == _rule(plain, best).key, (losers, plain.latency_ms, best.latency_ms)
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
        assert entry.model_path == served_file
        assert entry.session_s["cold_s"] > 0 and entry.session_s["warm_s"] > 0
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
