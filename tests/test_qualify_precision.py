"""Precision is detected, not assumed: real quantized and fp16 graphs (onnxruntime.quantization, onnxruntime's
float16 converter) are labelled int8 / fp16, judged with the target's row for that precision, and compared
with their fp32 original (top-1 agreement, speed-up on the same provider)."""

from __future__ import annotations

import onnx
import pytest
import realmodels as rm
from support.qualify import BF16_X86

from agent import samples
from agent.package.load import load_package
from agent.package.precision import effective, graph_precision, quant_ops
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.targets import get_target

PROFILE = BF16_X86
FAST = QualifyOptions(latency_budget_s=0.2, row_timeout_s=300)


@pytest.fixture(scope="module")
def target():
    return get_target("generic-x86_64")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    return {
        "qdq": rm.qdq_with_original(root / "qdq"),
        "dynamic": rm.dynamic_int8_package(root / "dynamic"),
        "fp16": rm.fp16_package(root / "fp16"),
        "fp16io": rm.fp16_package(root / "fp16io", keep_io_types=False),
        "fp32": rm.classifier_package(root / "fp32", sets=4),
    }


def test_real_converters_give_the_labels(made):
    assert load_package(made["qdq"]).precision == "int8"
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(quant_ops(onnx.load(made["qdq"] / "model.onnx")))
    dyn = onnx.load(made["dynamic"] / "model.onnx")
    assert graph_precision(dyn) == "int8" and "DynamicQuantizeLinear" in quant_ops(dyn)
    assert load_package(made["fp16"]).precision == "fp16"
    assert load_package(made["fp32"]).precision == "fp32"
    assert graph_precision(samples.tiny_model(1.0)) == "fp32"
    doc = load_package(made["qdq"]).to_dict()
    assert doc["precision"] == "int8" and doc["reference"] == "model_fp32.onnx"


def test_row_label_is_the_coarser_of_graph_and_runtime():
    assert effective("int8", "f32") == "int8" and effective("int8", "bf16") == "int8"
    assert effective("fp16", "f32") == "fp16" and effective("fp16", None) == "fp16"
    assert effective("fp16", "bf16") == "bf16"
    assert effective("fp32", "bf16") == "bf16" and effective("fp32", "f32") == "f32"  # as reported today


def test_int8_qdq_classifier_judged_with_int8_row_against_its_fp32_original(made, target):
    d = qualify(made["qdq"], PROFILE, target, providers=["cpu", "openvino"], options=FAST)
    assert "fp32 original model_fp32.onnx" in d.reference
    int8_tol = target.tolerances("cpu", "int8").to_dict()
    for row in d.results:
        assert row.precision == "int8" and row.model_precision == "int8", row
        assert row.accuracy["against"] == "fp32 original" and row.accuracy["sets"] == 24
        assert row.accuracy["tolerance"] == {**int8_tol, **target.tolerances(row.provider, "int8").to_dict()}
        assert row.status == "passed", row.reason
        assert row.accuracy["top1_agreement"] >= int8_tol["top1_agreement"]
        assert row.original["file"] == "model_fp32.onnx"
        assert row.original["speedup"] == pytest.approx(row.original["p50_ms"] / row.latency_ms["p50"], rel=1e-2)
    assert d.selected in ("cpu", "openvino") and d.selected_precision == "int8"


def test_an_int8_model_that_disagrees_with_its_original_fails_top1(made, target, tmp_path):
    """The same int8 graph against an original whose classes are shifted by one loses top-1 agreement."""
    import shutil

    import numpy as np
    from onnx import numpy_helper

    bad = tmp_path / "bad"
    shutil.copytree(made["qdq"], bad)
    other = rm.classifier_model()
    for i, init in enumerate(other.graph.initializer):
        if init.name in ("wf", "bf"):
            rolled = np.roll(numpy_helper.to_array(init), 1, axis=-1)
            other.graph.initializer[i].CopyFrom(numpy_helper.from_array(rolled, init.name))
    onnx.save(other, bad / "model_fp32.onnx")
    d = qualify(bad, PROFILE, target, providers=["cpu"], options=FAST)
    row = d.results[0]
    assert row.status == "failed" and row.stage == "accuracy"
    assert "top1_agreement" in row.reason and "< 0.95" in row.reason and "(int8)" in row.reason
    assert d.selected is None


def test_dynamic_int8_regression_is_judged_by_max_rel(made, target):
    d = qualify(made["dynamic"], PROFILE, target, providers=["cpu"], options=FAST)
    row = d.results[0]
    assert row.precision == "int8" and row.accuracy["against"] == "fp32 original"
    assert row.status == "passed", row.reason
    assert row.accuracy["max_rel"] <= row.accuracy["tolerance"]["max_rel"]


def test_task_decides_which_metric_judges():
    from agent.qualify.original import is_classifier, task_violations
    from agent.targets import Tolerance

    tol = Tolerance(max_abs=0.01, max_rel=0.1, min_cosine=0.99, top1_agreement=0.95)
    m = {"y": {"max_abs": 0.5, "max_rel": 0.5, "scale": 1.0, "cosine": 0.999, "top1_agreement": 1.0, "top1_rows": 9}}
    assert task_violations(m, tol, classifier=True) == []  # a classifier: top-1 agrees, max_rel is evidence
    assert "max_rel 0.5 > 0.1" in task_violations(m, tol, classifier=False)[0]
    low = {"y": {**m["y"], "max_rel": 0.0, "max_abs": 0.0, "top1_agreement": 0.5}}
    assert "top1_agreement 0.500 < 0.95 over 9 rows" in task_violations(low, tol)[0]
    assert is_classifier("image classification") is True and is_classifier("regression") is False
    assert is_classifier(None) is None


def test_fp16_graph_is_labelled_fp16_on_cpu_and_judged_with_the_fp16_row(made, target):
    d = qualify(made["fp16"], PROFILE, target, providers=["cpu"], options=FAST)
    row = d.results[0]
    assert row.precision == "fp16" and row.accuracy["tolerance"] == target.tolerances("cpu", "fp16").to_dict()
    assert row.status == "passed", row.reason


def test_fp16_graph_with_fp16_inputs_meets_its_fp32_original_in_each_ones_types(made, target):
    """The golden inputs are float16; the fp32 original gets the same values as float32, for agreement and
    for its own latency (the speed-up)."""
    pkg = load_package(made["fp16io"])
    assert pkg.inputs[0].dtype == "float16" and pkg.precision == "fp16"
    d = qualify(pkg, PROFILE, target, providers=["cpu"], options=FAST)
    row = d.results[0]
    assert row.status == "passed", row.reason
    assert row.precision == "fp16" and row.accuracy["against"] == "fp32 original"
    assert "error" not in row.original and row.original["speedup"] > 0
