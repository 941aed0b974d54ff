"""Packages of variants: every variant on every provider, the fastest passing pair served (the daemon serves
that variant's file), the whole matrix kept; `edge-agent quantize` writes such a package from an fp32 one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import realmodels as rm
from support.daemon import deploy, running_agent

from agent.errors import ModelError
from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.package.load import load_package
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.targets import get_target

PROFILE = HardwareProfile(
    arch="x86_64",
    os="Linux",
    cpu=CpuInfo(vendor="AuthenticAMD", model="test", cores=2, flags=("avx2", "avx512f", "avx512_bf16")),
)
FAST = QualifyOptions(latency_budget_s=0.2, row_timeout_s=300)


def edge_agent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    src = rm.classifier_package(root / "fp32", sets=16)
    p = edge_agent("quantize", str(src), "--out", str(root / "out"), "--json")
    assert p.returncode == 0, p.stderr
    return root / "out", json.loads(p.stdout), p.stderr


def test_quantize_writes_a_package_of_variants(quantized):
    out, doc, stderr = quantized
    assert "calibrated on 16 test set(s)" in stderr
    assert doc["mode"] == "static" and doc["calibration_sets"] == 16 and doc["int8_precision"] == "int8"
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(doc["quant_ops"]) and doc["int8_bytes"] < doc["fp32_bytes"]
    pkg = load_package(out)
    assert {k: v.name for k, v in pkg.variants.items()} == {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert pkg.precision == "fp32" and len(pkg.datasets) == 16


def test_every_variant_on_every_provider_and_the_matrix_is_kept(quantized):
    out, _, _ = quantized
    d = qualify(out, PROFILE, get_target("generic-x86_64"), providers=["cpu", "openvino"], options=FAST)
    keys = {r.key for r in d.results}
    assert {"fp32/cpu", "int8/cpu", "fp32/openvino", "int8/openvino"} <= keys
    by = {r.key: r for r in d.results}
    assert by["int8/cpu"].precision == "int8" and by["fp32/cpu"].precision == "f32"
    assert by["int8/cpu"].status == "passed", by["int8/cpu"].reason
    assert by["int8/cpu"].accuracy["against"] == "fp32 original" and by["int8/cpu"].original["speedup"] > 0
    assert by["int8/cpu"].model_path.endswith("model.int8.onnx")
    doc = d.to_dict()
    assert doc["selected_variant"] == by[d.selected_key].variant
    assert doc["model"]["variants"]["int8"]["precision"] == "int8"
    assert set(doc["losers"]) == keys - {d.selected_key}
    fastest = min((r for r in d.results if r.status == "passed"), key=lambda r: r.latency_ms["p50"])
    assert d.selected_key == fastest.key or "within noise" in d.reason


def _mismatched_variants(root):
    """Variant `a` is a different model from the golden outputs' (it fails accuracy); `b` made them."""
    root.mkdir(parents=True)
    onnx.save(rm.mlp_model(seed=1), root / "a.onnx")
    onnx.save(rm.mlp_model(seed=0), root / "b.onnx")
    rm.write_sets(root, root / "b.onnx", rm.mlp_sets(1))
    rm.write_meta(root, name="mixed", version="1", variants={"a": "a.onnx", "b": "b.onnx"})
    return root


def test_the_daemon_serves_the_selected_variants_file(tmp_path):
    pkg = _mismatched_variants(tmp_path / "mixed")
    gen = running_agent(tmp_path / "agent")
    agent = next(gen)
    try:
        dep = deploy(agent, "1", writer=lambda d: shutil.copytree(pkg, d), name="mixed")
        assert dep.state.value == "committed", dep.reason
        decision = json.loads((agent.state_dir / "decisions" / f"{dep.id}.json").read_text())
        assert decision["selected_variant"] == "b" and decision["selected_key"] == "b/cpu"
        assert next(r for r in decision["results"] if r["key"] == "a/cpu")["status"] == "failed"
        x = rm.mlp_sets(1)[0]["x"]
        from test_realmodels_daemon import infer

        served = infer(agent.url, "mixed", {"x": x})["y"]
        want_b = ort.InferenceSession(str(pkg / "b.onnx")).run(None, {"x": x})[0]
        np.testing.assert_allclose(served, want_b, rtol=1e-5, atol=1e-5)
        from agent.lifecycle.slots import ModelSlots

        assert ModelSlots(agent.state_dir).committed("mixed").model_path.endswith("b.onnx")
    finally:
        next(gen, None)


@pytest.mark.parametrize(
    "meta,why",
    [
        ({"variants": {"x": "../elsewhere.onnx"}}, "variants.x: '../elsewhere.onnx' must be a relative path"),
        ({"variants": {"x": "missing.onnx"}}, "variants.x: 'missing.onnx' is not a file in the package"),
        ({"variants": {"bad name": "model.onnx"}}, "variants.bad name: a variant name is letters"),
        ({"variants": ["model.onnx"]}, "variants: expected a mapping"),
        ({"reference": "nope.onnx"}, "reference: 'nope.onnx' is not a file in the package"),
    ],
)
def test_bad_variants_and_reference_are_refused_with_the_key(tmp_path, meta, why):
    root = tmp_path / "p"
    root.mkdir()
    onnx.save(rm.mlp_model(), root / "model.onnx")
    rm.write_meta(root, name="p", **meta)
    with pytest.raises(ModelError) as err:
        load_package(root)
    assert why in str(err.value)


def test_a_variant_that_fails_the_checker_is_refused(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    onnx.save(rm.mlp_model(), root / "model.onnx")
    (root / "broken.onnx").write_bytes(b"not a model")
    rm.write_meta(root, name="p", variants={"fp32": "model.onnx", "int8": "broken.onnx"})
    with pytest.raises(ModelError, match="broken.onnx: not a valid ONNX model"):
        load_package(root)


def test_quantize_errors_are_one_line(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    onnx.save(rm.mlp_model(), bare / "model.onnx")
    p = edge_agent("quantize", str(bare), "--out", str(tmp_path / "o1"))
    assert p.returncode == 1 and "static quantization calibrates on the package's test data" in p.stderr
    assert "--mode dynamic" in p.stderr and "Traceback" not in p.stderr
    p = edge_agent("quantize", str(bare), "--out", str(tmp_path / "o2"), "--mode", "dynamic")
    assert p.returncode == 0, p.stderr
    assert "MatMulInteger" in p.stdout and load_package(tmp_path / "o2").variants
    p = edge_agent("quantize", str(bare), "--out", str(tmp_path / "o2"), "--mode", "dynamic")
    assert p.returncode == 1 and "already exists and is not an empty directory" in p.stderr
    p = edge_agent("quantize", str(tmp_path / "o2"), "--out", str(tmp_path / "o3"), "--mode", "dynamic")
    assert p.returncode == 1 and "already a package of variants" in p.stderr
    qdq = rm.qdq_with_original(tmp_path / "qdq", sets=4)
    p = edge_agent("quantize", str(qdq), "--out", str(tmp_path / "o4"))
    assert p.returncode == 1 and "the model is int8 already" in p.stderr
    p = edge_agent("quantize", str(tmp_path / "nothing"), "--out", str(tmp_path / "o5"))
    assert p.returncode == 1 and "model package not found" in p.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o4").exists()


def test_a_reference_with_other_tensors_is_refused_at_load(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    onnx.save(rm.mlp_model(), root / "model.onnx")
    onnx.save(rm.classifier_model(), root / "other.onnx")
    rm.write_meta(root, name="p", reference="other.onnx")
    with pytest.raises(ModelError) as err:
        load_package(root)
    assert "reference: other.onnx has inputs ['input'] but model.onnx has ['x']" in str(err.value)
    rm.write_meta(root, name="p", variants={"a": "model.onnx", "b": "other.onnx"})
    with pytest.raises(ModelError, match="variants.b: other.onnx has inputs"):
        load_package(root)


def test_an_int8_variant_that_fails_is_not_served(quantized, tmp_path):
    """A stricter int8 rule (model.yaml) than the int8 variant meets: the fp32 variant serves, and the int8
    rows say why they lost."""
    import yaml

    out, _, _ = quantized
    pkg = tmp_path / "strict"
    shutil.copytree(out, pkg)
    meta = yaml.safe_load((pkg / "model.yaml").read_text())
    meta["tolerances"] = {"cpu:int8": {"max_rel": 1.0e-6, "max_abs": 0.0}}
    rm.write_meta(pkg, **{**meta, "task": "segmentation"})  # not a classifier: judged by max_rel
    d = qualify(pkg, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    by = {r.key: r for r in d.results}
    assert by["int8/cpu"].status == "failed" and "max_rel" in by["int8/cpu"].reason
    assert d.selected_key == "fp32/cpu" and d.selected_variant == "fp32"
    assert d.losers["int8/cpu"].startswith("failed: accuracy")


def test_warm_up_feeds_the_plan_in_the_served_variants_input_types(tmp_path):
    """The daemon replays qualification's input plan before a swap; a variant with float16 inputs gets the
    same values as float16 (as qualification fed it), at the declared opt and max shapes."""
    from onnx import TensorProto, helper

    from agent.lifecycle.serve import warm_feeds
    from agent.lifecycle.slots import SlotEntry
    from agent.providers import get

    for dtype, file in ((TensorProto.FLOAT, "model.onnx"), (TensorProto.FLOAT16, "model.fp16.onnx")):
        io = [helper.make_tensor_value_info(n, dtype, ["n", 4]) for n in ("x", "y")]
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", io[:1], io[1:])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, tmp_path / file)
    shapes = {"x": {"min": [1, 4], "opt": [2, 4], "max": [8, 4]}}
    rm.write_meta(
        tmp_path, name="w", version="1", input_shapes=shapes, variants={"a": "model.onnx", "h": "model.fp16.onnx"}
    )
    pkg = load_package(tmp_path)
    sess = get("cpu").open_session(str(tmp_path / "model.fp16.onnx"), options={})
    entry = SlotEntry(
        version="1", sha256="0" * 64, provider="cpu", package_dir=str(tmp_path), input_specs=pkg.to_dict()["inputs"]
    )
    sets = warm_feeds(sess, entry)
    assert [(f["x"].dtype.name, f["x"].shape) for f in sets] == [("float16", (2, 4)), ("float16", (8, 4))]
    for feeds in sets:
        sess.run(feeds)
    sess.close()
