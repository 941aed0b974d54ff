"""Golden data said for what it is (issue 36): `edge-agent package` writes who made the golden outputs
(model.yaml golden_made_by: onnxruntime's CPU provider); qualification says "accuracy vs own golden (not
independent)" in the cpu row, the decision record and the human and --json output, and checks that row against
onnx's reference evaluator too; where the evaluator cannot run, the row's accuracy is not checked and the target
decides. A package without golden_made_by reads as made by "unknown"; one made by another runtime is not the cpu
row's own."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
import yaml
from clirunner import edge_agent
from support.qualify import contrib_gelu

from agent import samples
from agent.errors import ModelError
from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.package.build import Label, build
from agent.package.load import load_package
from agent.qualify.decision import Row
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.targets import get_target

PROFILE = HardwareProfile(arch="x86_64", os="linux", cpu=CpuInfo(model="test", vendor="test", cores=2))
FAST = QualifyOptions(latency_budget_s=0.05, row_timeout_s=120)
OWN = "accuracy vs own golden (not independent)"


def _packaged(tmp_path, model, name="m"):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    specs = [i for i in model.graph.input]
    dims = [d.dim_value or 1 for d in specs[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return build(path, [tmp_path / "x.npy"], tmp_path / f"{name}-pkg", label=Label(name, "1"), force=False)


def test_a_package_says_who_made_its_golden_outputs_and_the_cpu_row_says_it_is_its_own(tmp_path):
    import onnxruntime as ort

    built = _packaged(tmp_path, samples.cnn_model(), "cnn")
    made = {"runtime": "onnxruntime", "version": ort.__version__, "provider": "CPUExecutionProvider"}
    assert built.golden_made_by == made and built.to_dict()["golden_made_by"] == made
    assert yaml.safe_load((built.out / "model.yaml").read_text())["golden_made_by"] == made
    pkg = load_package(built.out)
    assert pkg.to_dict()["golden_made_by"] == made

    d = qualify(built.out, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    row = d.row("cpu")
    assert row.status == "passed", row.reason
    assert row.accuracy_basis == "own golden (not independent)" and OWN in row.reason, row.reason
    assert row.accuracy["max_rel"] == 0  # the runtime compared with itself
    ind = row.accuracy["independent"]
    assert ind["reference"] == "onnx-reference-evaluator" and 0 < ind["max_rel"] <= row.accuracy["tolerance"]["max_rel"]
    assert "vs onnx-reference-evaluator max_rel" in row.reason and row.accuracy_checked is True
    doc = d.to_dict()  # the decision record (and qualify --json)
    assert doc["results"][0]["accuracy_basis"] == "own golden (not independent)"
    assert doc["model"]["golden_made_by"] == made
    assert doc["reference"] == f"golden outputs (made by onnxruntime {ort.__version__} CPUExecutionProvider)"

    text = edge_agent("qualify", built.out, "--provider", "cpu", "--budget", "0.2")
    assert text.returncode == 0, text.stderr
    assert f"cpu: {OWN} (golden made by onnxruntime {ort.__version__} CPUExecutionProvider); " in text.stdout
    assert "vs onnx reference evaluator max_rel" in text.stdout, text.stdout


def test_where_the_evaluator_cannot_run_the_own_golden_row_is_not_checked_and_the_target_decides(tmp_path):
    built = _packaged(tmp_path, contrib_gelu(), "gelu")
    d = qualify(built.out, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    row = d.row("cpu")
    assert row.status == "passed" and row.accuracy_checked is False and d.accuracy_checked is False
    assert f"{OWN}, accuracy not checked otherwise (reference cannot run the graph" in row.reason, row.reason
    base = get_target("generic-x86_64")
    strict = dataclasses.replace(base, serving={**base.serving, "unchecked_accuracy": "refuse"})
    d = qualify(built.out, PROFILE, strict, providers=["cpu"], options=FAST)
    row = d.row("cpu")
    assert d.selected is None and row.status == "failed" and row.stage == "accuracy"
    assert "only against its own golden data and no independent reference" in row.reason, row.reason


def test_golden_data_of_unknown_or_other_origin_is_not_the_rows_own(tmp_path):
    old = samples.write_package(tmp_path / "old", samples.cnn_model(), name="old")  # golden, origin not said
    assert load_package(old).to_dict()["golden_made_by"] == {"runtime": "unknown", "provider": "unknown"}
    d = qualify(old, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    assert d.row("cpu").accuracy_basis is None and d.reference == "golden outputs (made by unknown)"
    other = {"runtime": "openvino", "version": "2026.4", "provider": "CPU"}
    pkg = samples.write_package(tmp_path / "ov", samples.cnn_model(), name="ov", extra_yaml={"golden_made_by": other})
    d = qualify(pkg, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    row = d.row("cpu")
    assert row.accuracy_basis is None and OWN not in row.reason and "independent" not in row.accuracy
    no_golden = samples.write_package(tmp_path / "none", samples.cnn_model(), name="none", golden=False)
    assert load_package(no_golden).to_dict()["golden_made_by"] is None


@pytest.mark.parametrize(
    "bad, key",
    [
        ("onnxruntime", "golden_made_by"),
        ({"runtime": "onnxruntime"}, "golden_made_by"),
        ({"runtime": "onnxruntime", "provider": "CPU", "by": "me"}, "golden_made_by"),
        ({"runtime": "onnxruntime", "provider": 3}, "golden_made_by.provider"),
        ({"runtime": "x" * 201, "provider": "CPU"}, "golden_made_by.runtime"),
    ],
)
def test_a_malformed_golden_made_by_is_refused_naming_the_key(tmp_path, bad, key):
    pkg = samples.write_package(tmp_path / "p", samples.cnn_model(), name="p", extra_yaml={"golden_made_by": bad})
    with pytest.raises(ModelError, match=f"{key}: "):
        load_package(pkg)
    out = edge_agent("package", "--check", pkg, "--json")
    assert out.returncode == 1 and "golden_made_by" in json.dumps(json.loads(out.stdout)), out.stdout


def test_the_evaluators_tolerance_applies_to_an_own_golden_row():
    from agent.qualify import owngolden
    from agent.qualify.accuracy import as_tolerance

    got = {"y": np.ones((2, 4), np.float32)}
    tol = as_tolerance({"max_abs": 0.0, "max_rel": 1e-3})
    row = {"accuracy": {"max_rel": 0.0}}
    owngolden.check(row, {"y": got["y"].copy()}, got, tol)
    assert row["accuracy"]["independent"]["disagrees"] == []
    owngolden.check(row, {"y": got["y"] * 2}, got, tol)
    ind = row["accuracy"]["independent"]
    assert ind["max_rel"] == 0.5 and ind["disagrees"][0].startswith("y: max_rel 0.5 > 0.001"), ind
    # in the parent: not confirmed, the accuracy not checked (the target decides), never a failure by itself
    passed = Row(provider="cpu", status="passed", reason="max_rel 0", accuracy=row["accuracy"], accuracy_checked=True)
    owngolden.mark(passed, "")
    assert passed.status == "passed" and passed.accuracy_checked is False
    assert passed.reason.endswith(
        f"; {OWN}, not confirmed: onnx-reference-evaluator disagrees (y: max_rel 0.5 > 0.001"
        " (max error 1, allowed 0.002))"
    ), passed.reason
