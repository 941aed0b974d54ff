"""Without golden data, accuracy is judged against onnx's reference evaluator (independent of every runtime);
where it cannot run, the cpu row says its accuracy was not checked and the target decides whether it may win."""

from __future__ import annotations

import dataclasses

import onnx
import pytest
from support.qualify import contrib_gelu

from agent import samples
from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.qualify import reference
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.targets import get_target

PROFILE = HardwareProfile(arch="x86_64", os="linux", cpu=CpuInfo(model="test", vendor="test", cores=2))
FAST = QualifyOptions(latency_budget_s=0.05, row_timeout_s=120)


def _contrib_gelu(path):
    onnx.save(contrib_gelu(), path)
    return path


def test_sample_cnn_without_golden_data_is_judged_against_the_independent_reference(tmp_path):
    pkg = samples.write_package(tmp_path / "cnn", samples.cnn_model(), name="cnn", golden=False)
    d = qualify(pkg, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    assert d.reference == "onnx-reference-evaluator"
    row = d.row("cpu")
    assert row.status == "passed", row.reason
    assert row.accuracy_checked is True and d.accuracy_checked is True
    assert d.to_dict()["results"][0]["accuracy_checked"] is True
    # ORT's kernels and numpy's sum in different orders: an error, small, and never the 0 of a self-comparison
    assert 0 < row.accuracy["max_rel"] <= row.accuracy["tolerance"]["max_rel"]


def test_a_graph_the_reference_cannot_run_leaves_the_cpu_row_unchecked(tmp_path):
    path = _contrib_gelu(tmp_path / "gelu.onnx")
    d = qualify(path, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    assert d.reference.startswith("onnxruntime-cpu-fp32 (reference cannot run the graph")
    row = d.row("cpu")
    assert row.status == "passed" and row.accuracy_checked is False
    assert "accuracy not checked" in row.reason and d.selected == "cpu" and d.accuracy_checked is False


def test_a_target_that_refuses_unchecked_accuracy_does_not_select_it(tmp_path):
    path = _contrib_gelu(tmp_path / "gelu.onnx")
    base = get_target("generic-x86_64")
    strict = dataclasses.replace(base, serving={**base.serving, "unchecked_accuracy": "refuse"})
    d = qualify(path, PROFILE, strict, providers=["cpu"], options=FAST)
    row = d.row("cpu")
    assert d.selected is None and row.status == "failed" and row.stage == "accuracy"
    assert "unchecked_accuracy: refuse" in row.reason


def test_checked_rule():
    assert reference.checked("cpu", "onnx-reference-evaluator")
    assert reference.checked("openvino", "onnxruntime-cpu-fp32 (reference too slow or too large ...)")
    assert not reference.checked("cpu", "onnxruntime-cpu-fp32 (reference too slow or too large ...)")
    assert reference.checked("cpu", "golden outputs")


@pytest.mark.parametrize("bad", ["maybe", 1])
def test_unknown_rule_is_refused_with_its_key(tmp_path, bad):
    import yaml

    from agent.errors import ConfigError
    from agent.targets import parse_target

    src = get_target("generic-x86_64").path
    raw = yaml.safe_load(open(src, encoding="utf-8"))
    raw["serving"] = {**(raw.get("serving") or {}), "unchecked_accuracy": bad}
    out = tmp_path / "generic-x86_64.yaml"
    out.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match="serving.unchecked_accuracy"):
        parse_target(out)
