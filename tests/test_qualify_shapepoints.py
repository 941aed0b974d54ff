"""Issue 42: models whose cost grows with their inputs. A text-to-speech-like model made in code (tests/tts_model.py:
token ids, a style vector and a speed in; audio whose length follows the token values out; attention-like blocks
whose cost grows with n^2, or a chain growing with n^3) packaged with golden data and a declared max longer than
any golden set: every declared point gets a latency figure and the runs it rests on, the max point's inputs come
from the golden values, a slow max point costs the row nothing but its own figure, and the model is served."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from clirunner import edge_agent
from support.daemon import serving_package
from tts_model import VOCAB, tts_inputs, tts_model

from agent.errors import ConfigError
from agent.package.inputs import load_dataset, package_plan
from agent.package.load import load_package
from agent.serving.codec import datatype_of
from agent.targets import Tolerance


def infer(url: str, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = [
        {"name": k, "shape": list(v.shape), "datatype": datatype_of(v.dtype), "data": v.ravel().tolist()}
        for k, v in feeds.items()
    ]
    body = json.dumps({"inputs": inputs}).encode()
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        doc = json.loads(resp.read())
    return {o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"]) for o in doc["outputs"]}


def _package(tmp_path: Path, n_max: int, **model) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    onnx_file = tts_model(src / "tts.onnx", **model)
    out = tmp_path / "pkg"
    r = edge_agent("package", onnx_file, "--inputs", *tts_inputs(src), "--out", out, "--name", "tts", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["input_shapes"] == {"tokens": [1, 56]}
    meta = yaml.safe_load((out / "model.yaml").read_text())
    meta["input_shapes"] = {"tokens": {"min": [1, 3], "opt": [1, 56], "max": [1, n_max]}}
    (out / "model.yaml").write_text(yaml.safe_dump(meta))
    return out


def _qualify(pkg: Path, *args: str) -> dict:
    q = edge_agent("qualify", pkg, "--provider", "cpu", "--json", *args, timeout=300)
    assert q.returncode == 0, (q.stdout[-3000:], q.stderr[-3000:])
    return json.loads(q.stdout)


def _points(row: dict) -> dict[str, dict]:
    return {p["point"]: p for p in row["latency_points"]}


def test_a_tts_package_with_a_declared_max_4x_longer_qualifies_at_every_point(tmp_path):
    pkg = _package(tmp_path, 224, dim=256, layers=16)
    plan = package_plan(load_package(pkg))
    golden, _ = load_dataset(pkg / "test_data_set_0", load_package(pkg).inputs, load_package(pkg).outputs)
    assert plan.at_max is not None and plan.at_max["tokens"].shape == (1, 224)
    # the max point's token ids are the golden set's own values (resampled), nothing the model has not seen
    assert set(np.unique(plan.at_max["tokens"])) <= set(np.unique(golden["tokens"]))
    assert np.array_equal(plan.at_max["style"], golden["style"]) and np.array_equal(
        plan.at_max["speed"], golden["speed"]
    )
    assert set(plan.generated) == {"min.tokens", "max.tokens"} and "resampled" in plan.generated["max.tokens"]

    decision = _qualify(pkg, "--budget", "1", "--timeout", "300")
    assert decision["selected"] == "cpu", decision["reason"]
    row = decision["results"][0]
    points = _points(row)
    assert set(points) == {"min", "golden+opt", "max"}, row["latency_points"]
    for p in points.values():
        assert p["runs"] >= 1 and p["p50"] > 0, p
    assert points["max"]["inputs"].startswith("tokens[1, 224]") and "generated" in points["max"]["source"]
    assert row["latency_max_ms"]["runs"] == points["max"]["runs"]
    assert row["generated_inputs"] == plan.generated
    assert f"at max {points['max']['p50']:.3g} ms over {points['max']['runs']} runs" in row["reason"], row["reason"]
    human = edge_agent("qualify", pkg, "--provider", "cpu", "--budget", "0.2", timeout=300)
    assert human.returncode == 0 and "cpu at max tokens[1, 224]" in human.stdout, human.stdout


def infer_binary(url: str, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The KServe v2 binary extension both ways: raw little-endian tensors after the JSON header."""
    inputs = [
        {
            "name": k,
            "shape": list(v.shape),
            "datatype": datatype_of(v.dtype),
            "parameters": {"binary_data_size": v.nbytes},
        }
        for k, v in feeds.items()
    ]
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    body = head + b"".join(np.ascontiguousarray(v).tobytes() for v in feeds.values())
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw, n = resp.read(), int(resp.headers["Inference-Header-Content-Length"])
    doc, rest, out = json.loads(raw[:n]), raw[n:], {}
    for o in doc["outputs"]:
        assert o["datatype"] == "FP32", o
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(rest[:size], "<f4").reshape(o["shape"])
        rest = rest[size:]
    assert not rest, len(rest)
    return out


def test_a_daemon_qualifies_the_tts_package_at_every_declared_point_commits_it_and_serves_longer_utterances(
    tmp_path,
):
    """The done-when of issue 42 through a real daemon: the package dropped into its inbox qualifies (the decision
    record has a latency figure and its run count at each declared point, the journal the qualification's wall
    time), commits after a short probation, and answers over HTTP at the golden length (JSON) and at lengths up to
    the declared max (binary), each with the audio length the model computes from the token values."""
    pkg = _package(tmp_path, 224, dim=256, layers=16)
    p = load_package(pkg)
    golden, _ = load_dataset(pkg / "test_data_set_0", p.inputs, p.outputs)
    plan = package_plan(p)
    with serving_package(tmp_path, pkg, "tts", env={"EDGE_AGENT_QUALIFY_BUDGET_S": "0.4"}) as d:
        cfg, state = d.config, d.state_dir
        status = edge_agent("status", "--config", cfg, "--json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["models"]["tts"]["version"] == "1" and doc["models"]["tts"]["state"] == "committed", doc
        dep_id = doc["deployments"]["tts"]["id"]

        decision = json.loads((state / "decisions" / f"{dep_id}.json").read_text())
        assert decision["selected"] == "cpu", decision["reason"]
        (row,) = [r for r in decision["results"] if r["key"] == decision["selected_key"]]
        points = _points(row)
        assert set(points) == {"min", "golden+opt", "max"}, row["latency_points"]
        for point in points.values():
            assert point["runs"] >= 1 and point["p50"] > 0 and not point.get("skipped"), point
        assert points["max"]["inputs"].startswith("tokens[1, 224]") and "generated" in points["max"]["source"]
        assert points["golden+opt"]["inputs"].startswith("tokens[1, 56]"), points["golden+opt"]
        journal = json.loads((state / "deployments" / f"{dep_id}.json").read_text())
        window = journal["data"]["qualification"]
        wall = window["finished"] - window["started"]
        assert wall > 0 and window["queued_s"] >= 0, window
        print(f"\nqualification in the daemon: {wall:.1f} s (queued {window['queued_s']:.2f} s)")
        for point in row["latency_points"]:
            tokens = point["inputs"].split("], ")[0] + "]"
            print(f"  {point['point']:>10} {tokens}: p50 {point['p50']:.3g} ms over {point['runs']} runs")

        plain = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
        longer = {**golden, "tokens": golden["tokens"][:, np.arange(140) % 56]}  # 2.5x, within the declared max
        lengths = []
        for feeds, call in ((golden, infer), (longer, infer_binary), (plan.at_max, infer_binary)):
            served = call(d.url, "tts", feeds)["audio"]
            want = plain.run(None, feeds)[0]
            assert served.shape == want.shape, (feeds["tokens"].shape, served.shape, want.shape)
            np.testing.assert_allclose(served, want, rtol=1e-4, atol=1e-4)
            lengths.append(served.shape[0])
        assert lengths[0] < lengths[1] < lengths[2], lengths  # the audio grows with the utterance
        print(f"  audio samples at tokens 56 / 140 / 224: {lengths}")


def test_a_max_point_slower_than_its_budget_or_the_row_never_times_the_row_out(tmp_path):
    """Cost ~ n^3 (a chain of [n, n] MatMuls): fitted between the declared min and the golden length, where a fixed
    overhead hides it, the check before the max point expects far less, so it lets the run start. At 16x the golden length one run outlasts the point's budget: its figure is that one
    run. At 64x it outlasts the whole row (--timeout): the worker is killed, the row keeps what it measured."""
    pkg = _package(tmp_path, 896, dim=64, layers=2, chain=40)
    decision = _qualify(pkg, "--budget", "0.5", "--timeout", "300")
    row = decision["results"][0]
    assert row["status"] == "passed" and decision["selected"] == "cpu", row["reason"]
    top = _points(row)["max"]
    assert top["runs"] >= 1 and top["p50"] > 0, top
    if top["runs"] == 1:  # one run over the budget, whose 3 runs would not fit the point's hard limit
        assert "over this point's budget" in top["stopped"], top
    assert set(_points(row)) == {"min", "golden+opt", "max"}, row["latency_points"]
    assert 1.0 <= top["estimate"]["exponent"] <= 3.0 and "fitted" in top["estimate"]["how"], top["estimate"]

    meta = yaml.safe_load((pkg / "model.yaml").read_text())
    meta["input_shapes"]["tokens"]["max"] = [1, 3584]
    (pkg / "model.yaml").write_text(yaml.safe_dump(meta))
    decision = _qualify(pkg, "--budget", "0.5", "--timeout", "25")
    row = decision["results"][0]
    assert row["status"] == "passed" and decision["selected"] == "cpu", row
    assert "timed out" not in row["reason"] and row["stage"] is None, row["reason"]
    points = _points(row)
    assert points["golden+opt"]["runs"] >= 1 and points["min"]["runs"] >= 1, points
    top = points["max"]
    if top.get("runs"):  # the host ran it faster than its cost says: a figure, never a lost row
        assert top["p50"] > 0, top
    else:
        assert top["skipped"].startswith(("not measured: a run at max did not finish", "not run:")), top
        assert "at max not" in row["reason"], row["reason"]


def test_inputs_for_an_uncovered_shape_come_from_the_golden_values_unless_input_values_says(tmp_path):
    from agent.package.fromgolden import tile

    pkg = _package(tmp_path, 112)
    meta = yaml.safe_load((pkg / "model.yaml").read_text())
    meta["input_shapes"] = {"tokens": {"min": [1, 3], "opt": [1, 28], "max": [1, 112]}}
    (pkg / "model.yaml").write_text(yaml.safe_dump(meta))
    p = load_package(pkg)
    golden, _ = load_dataset(pkg / "test_data_set_0", p.inputs, p.outputs)
    plan = package_plan(p)
    seen = set(np.unique(golden["tokens"]))
    assert plan.latency["tokens"].shape == (1, 28) and set(np.unique(plan.latency["tokens"])) <= seen
    assert set(np.unique(plan.at_max["tokens"])) <= seen
    assert set(plan.generated) == {"min.tokens", "opt.tokens", "max.tokens"}, plan.generated
    assert "generated at declared opt from the golden values" in plan.desc, plan.desc

    meta["input_values"] = {"tokens": {"low": 0, "high": VOCAB}}
    (pkg / "model.yaml").write_text(yaml.safe_dump(meta))
    plan = package_plan(load_package(pkg))
    assert plan.generated["max.tokens"].startswith("input_values"), plan.generated
    assert plan.at_max["tokens"].min() >= 0 and plan.at_max["tokens"].max() < VOCAB

    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    assert tile(x, [1, 14]).tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1]]
    assert tile(x, [1, 4]).tolist() == [[0, 1, 2, 3]]


def test_an_output_of_another_length_is_compared_on_its_overlap_within_the_targets_length_tolerance(tmp_path):
    from agent.qualify import accuracy
    from agent.targets import parse_target

    ref = np.sin(np.arange(90000, dtype=np.float32) * 0.01)
    got = ref[:87600] + np.float32(1e-6)
    equal = accuracy.compare({"audio": ref}, {"audio": got})
    assert accuracy.violations(equal, Tolerance()) == ["audio: shape [87600] != reference [90000]"]
    loose = accuracy.compare({"audio": ref}, {"audio": got}, 0.05)
    assert accuracy.violations(loose, Tolerance()) == [], loose
    assert loose["audio"]["length"] == {
        "axis": 0,
        "reference": 90000,
        "got": 87600,
        "change": 0.026667,
        "compared": 87600,
    }
    assert accuracy.length_note(loose) == "audio: length 87600 vs 90000 (-2.7%), compared on the first 87600"
    tight = accuracy.compare({"audio": ref}, {"audio": got}, 0.02)
    (why,) = accuracy.violations(tight, Tolerance())
    assert "length change 2.7% > max_length_change 2.0%" in why, why
    off = accuracy.compare({"audio": ref}, {"audio": -got}, 0.05)  # the overlap is still judged
    assert any("cosine" in v for v in accuracy.violations(off, Tolerance()))

    src = Path(__file__).resolve().parent.parent / "targets" / "generic-x86_64.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["tolerances"]["default"]["int8"] = {**doc["tolerances"]["default"]["int8"], "max_length_change": 0.05}
    path = tmp_path / "generic-x86_64.yaml"
    path.write_text(yaml.safe_dump(doc))
    tol = parse_target(path).tolerances("cpu", "int8")
    assert tol.max_length_change == 0.05 and tol.to_dict()["max_length_change"] == 0.05
    assert accuracy.as_tolerance(tol).max_length_change == 0.05
    assert "max_length_change" not in parse_target(src).tolerances("cpu", "int8").to_dict()
    doc["tolerances"]["default"]["int8"]["max_length_change"] = 2
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="max_length_change"):
        parse_target(path)


def test_a_row_whose_output_length_differs_passes_on_the_overlap_only_within_max_length_change(tmp_path):
    """The golden audio cut 2 % short stands for a reference of another length (as an int8 build's durations
    give): with model.yaml's max_length_change 0.05 the row compares the overlap and says so; without, it fails
    on the lengths, as a target that keeps requiring equal lengths does."""
    import onnx
    from onnx import numpy_helper

    pkg = _package(tmp_path, 112)
    for ds in sorted(pkg.glob("test_data_set_*")):
        out = ds / "output_0.pb"
        t = numpy_helper.to_array(onnx.load_tensor_from_string(out.read_bytes()))
        cut = numpy_helper.from_array(t[: int(t.size * 0.98)], "audio")
        out.write_bytes(cut.SerializeToString())
    meta = yaml.safe_load((pkg / "model.yaml").read_text())
    q = edge_agent("qualify", pkg, "--provider", "cpu", "--budget", "0.2", "--json", timeout=300)
    row = json.loads(q.stdout)["results"][0]
    assert q.returncode == 3 and row["status"] == "failed", row["reason"]
    assert "audio: shape [" in row["reason"] and "length" not in row["accuracy"]["outputs"]["audio"], row
    meta["tolerances"] = {"max_length_change": 0.05}
    (pkg / "model.yaml").write_text(yaml.safe_dump(meta))
    row = _qualify(pkg, "--budget", "0.2")["results"][0]
    assert row["status"] == "passed", row["reason"]
    length = row["accuracy"]["outputs"]["audio"]["length"]
    assert length["got"] > length["reference"] == length["compared"] and 0 < length["change"] <= 0.05, length
    assert f"compared on the first {length['compared']}" in row["reason"], row["reason"]
    assert row["accuracy"]["tolerance"]["max_length_change"] == 0.05


def test_the_daemon_warm_up_replays_the_max_point_only_when_qualification_ran_it(tmp_path):
    from agent.lifecycle.serve import warm_feeds
    from agent.lifecycle.slots import SlotEntry
    from agent.providers import get

    pkg = _package(tmp_path, 224)
    sess = get("cpu").open_session(str(pkg / "model.onnx"))
    try:
        ran = {"package_dir": str(pkg), "latency_points": [{"point": "max", "runs": 3, "p50": 1.0}]}
        skipped = {"package_dir": str(pkg), "latency_points": [{"point": "max", "runs": 0, "skipped": "not run: ..."}]}
        entry_of = lambda d: SlotEntry.from_data({"version": "1", "sha256": "ab" * 32, "provider": "cpu", **d})  # noqa: E731
        lengths = lambda d: [f["tokens"].shape[1] for f in warm_feeds(sess, entry_of(d))]  # noqa: E731
        assert lengths(ran) == [56, 224]
        assert lengths(skipped) == [56]
    finally:
        sess.close()
