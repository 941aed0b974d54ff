"""Real models, made by real converters or shipped in pip wheels, go qualify -> daemon -> served output, and
the served output matches plain onnxruntime on the same input; those OIP cannot carry are refused with the
remedy. One in-process daemon (inbox mode) qualifies on cpu and, where it is available, openvino."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import realmodels as rm
from support.agent import make_agent
from support.daemon import deploy

from agent.package.inputs import load_dataset
from agent.package.load import load_package
from agent.serving.codec import datatype_of

ROOT = Path(__file__).resolve().parent.parent

MAKERS = {
    "qdq-int8": lambda d: rm.qdq_with_original(d),
    "dynamic-int8": lambda d: rm.dynamic_int8_package(d),
    "fp16": lambda d: rm.fp16_package(d),
    "external-data": lambda d: rm.external_data_package(d),
    "skl-logreg": lambda d: rm.sklearn_package(d, zipmap=False),
    "magika": lambda d: rm.magika_package(d, sorted((ROOT / "agent" / "qualify").glob("*.py"))[:6]),
    "quantized-variants": lambda d: _quantized(d),
    "skl-zipmap": lambda d: rm.sklearn_package(d, zipmap=True),
    "ort-logreg-iris": lambda d: rm.ort_logreg_iris_package(d),
}
REFUSED = {"skl-zipmap", "ort-logreg-iris"}


def _quantized(d: Path) -> Path:
    """`edge-agent quantize`'s library call on an fp32 classifier: a package of variants {fp32, int8}."""
    from agent.qualify.quantize import quantize_package

    quantize_package(rm.classifier_package(d.parent / "quantize-src", sets=16), d)
    return d


@pytest.fixture(scope="module")
def agent(tmp_path_factory):

    tmp = tmp_path_factory.mktemp("daemon")
    a = make_agent(tmp, providers=["cpu", "openvino"], on_event=lambda e: None, start=True)
    yield a
    a.stop()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("made")
    return {name: make(root / name) for name, make in MAKERS.items()}


def _copy(src: Path):
    import shutil

    return lambda d: shutil.copytree(src, d)


def infer(url: str, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = [
        {"name": k, "shape": list(v.shape), "datatype": datatype_of(v.dtype), "data": v.ravel().tolist()}
        for k, v in feeds.items()
    ]
    req = urllib.request.Request(
        f"{url}/v2/models/{model}/infer", data=json.dumps({"inputs": inputs}).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        doc = json.loads(resp.read())
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in doc["outputs"]}


def _decision(agent, dep) -> dict:
    return json.loads((agent.state_dir / "decisions" / f"{dep.id}.json").read_text())


@pytest.mark.parametrize("name", list(MAKERS))
def test_real_model_through_the_daemon(agent, made, name):
    dep = deploy(agent, "1", writer=_copy(made[name]), name=name)
    if name in REFUSED:
        assert dep.state.value == "failed", dep.reason
        assert "refused" in dep.reason and "options={'zipmap': False}" in dep.reason, dep.reason
        assert ".py:" not in dep.reason and "ModelError" not in dep.reason, dep.reason
        return
    assert dep.state.value == "committed", dep.reason
    decision = _decision(agent, dep)
    row = next(r for r in decision["results"] if r["key"] == decision["selected_key"])
    pkg = load_package(made[name])
    feeds, _ = load_dataset(pkg.datasets[0], pkg.inputs, pkg.outputs)
    served = infer(agent.url, name, feeds)
    plain = ort.InferenceSession(str(row["model_path"]), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, feeds)))
    tol = row["accuracy"]["tolerance"]
    for out, want in expected.items():
        got = served[out]
        assert got.shape == want.shape, out
        scale = float(np.abs(want).max()) if want.size else 0.0
        bound = (tol["max_abs"] or 0) + (tol["max_rel"] or 0) * scale
        assert float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) <= bound, (out, row["key"])
    status = agent.status()["models"][name]
    assert status["provider"] == row["provider"] and status["precision"] == row["precision"]
    if name in ("qdq-int8", "dynamic-int8"):
        assert row["precision"] == "int8" and row["original"]["speedup"] > 0
    if name == "quantized-variants":  # the served file is the selected variant's
        assert decision["selected_variant"] == row["variant"] and row["model_path"].endswith(
            "model.int8.onnx" if row["variant"] == "int8" else "model.onnx"
        )
