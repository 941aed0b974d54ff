"""Outputs the Open Inference Protocol cannot carry are refused at qualification with the remedy, never served
wrong; BF16 models agree on datatypes (metadata, accepted input, output) on every provider."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import ml_dtypes
import numpy as np
import onnx
import pytest
import realmodels as rm
from onnx import TensorProto, helper
from support.qualify import BF16_X86
from support.serving import call_json, cast_model

from agent.errors import ModelError
from agent.providers import get
from agent.qualify import outputs as io
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.serving.http.server import OIPServer
from agent.serving.registry import ModelRegistry
from agent.targets import get_target

PROFILE = BF16_X86
FAST = QualifyOptions(latency_budget_s=0.2, row_timeout_s=300)


@pytest.fixture(scope="module")
def zipmap(tmp_path_factory):
    return rm.sklearn_package(tmp_path_factory.mktemp("zm") / "zipmap", zipmap=True)


def test_skl2onnx_zipmap_is_refused_with_the_remedy(zipmap):
    with pytest.raises(ModelError) as err:
        qualify(zipmap, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    msg = str(err.value)
    assert "output 'output_probability' has type seq(map(int64,tensor(float)))" in msg
    assert "(the output of a ZipMap node)" in msg and "options={'zipmap': False}" in msg


def test_onnxruntimes_shipped_logreg_iris_is_refused_by_the_cli(tmp_path):
    pkg = rm.ort_logreg_iris_package(tmp_path / "iris")
    p = subprocess.run(
        [sys.executable, "-m", "agent", "qualify", str(pkg), "--provider", "cpu", "--budget", "0.2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1, p.stderr
    # one error line, last; before it at most the progress line a slow start says (tests/test_qualify_cli.py)
    *before, last = p.stderr.splitlines()
    assert all(ln.startswith("qualify: reading ") for ln in before), p.stderr
    assert last.startswith("error: model.onnx: refused: output 'probabilities'") and "Traceback" not in p.stderr
    assert "zipmap" in p.stderr and ".py:" not in p.stderr


def test_zipmap_off_is_servable(tmp_path):
    pkg = rm.sklearn_package(tmp_path / "plain", zipmap=False)
    assert io.problems(pkg / "model.onnx") == []
    d = qualify(pkg, PROFILE, get_target("generic-x86_64"), providers=["cpu"], options=FAST)
    assert d.selected == "cpu" and d.results[0].status == "passed", d.results[0].reason


def test_non_oip_tensor_types_are_named():
    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)],
        "f8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    reasons = [io._problem("output", m.graph.output[0], "Cast")]
    assert "tensor(float8e4m3fn), which has no Open Inference Protocol datatype" in reasons[0]


def post(url: str, model: str, doc: dict) -> tuple[int, dict]:
    return call_json(f"{url}/v2/models/{model}/infer", doc)


def test_serving_guard_answers_a_clear_error_not_a_repr(zipmap):
    """Should a ZipMap model reach the registry anyway, infer answers 500 with a reason, not a Python repr."""
    reg = ModelRegistry()
    reg.activate("zm", "1", get("cpu").open_session(zipmap / "model.onnx"))
    srv = OIPServer(reg, port=0).start()
    try:
        x = {"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [5.0, 3.4, 1.5, 0.2]}
        status, doc = post(srv.url, "zm", {"inputs": [x], "outputs": [{"name": "output_probability"}]})
        assert status == 500 and "cannot carry" in doc["error"] and "zipmap" in doc["error"]
        assert "{0: " not in doc["error"] and "is a sequence of dict" in doc["error"]  # no dict repr
        status, doc = post(srv.url, "zm", {"inputs": [x], "outputs": [{"name": "output_label"}]})
        assert status == 200 and doc["outputs"][0]["datatype"] == "INT64"
    finally:
        srv.shutdown(10)
        reg.close()


def _providers() -> list[str]:
    return [n for n in ("cpu", "openvino") if get(n).probe(PROFILE).available]


@pytest.mark.parametrize("provider", _providers())
def test_bf16_metadata_input_and_output_agree_on_every_provider(provider, tmp_path):
    onnx.save(cast_model(TensorProto.BFLOAT16, TensorProto.FLOAT), tmp_path / "in.onnx")
    onnx.save(cast_model(TensorProto.FLOAT, TensorProto.BFLOAT16), tmp_path / "out.onnx")
    reg = ModelRegistry()
    for name in ("in", "out"):
        reg.activate(name, "1", get(provider).open_session(tmp_path / f"{name}.onnx"))
    srv = OIPServer(reg, port=0).start()
    try:
        with urllib.request.urlopen(f"{srv.url}/v2/models/in", timeout=30) as resp:
            meta = json.loads(resp.read())
        assert meta["inputs"][0]["datatype"] == "BF16"  # native OpenVINO said FP16 before
        status, doc = post(
            srv.url, "in", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "BF16", "data": [1.5, 0.1, -3]}]}
        )
        assert status == 200, doc
        assert doc["outputs"][0]["data"] == [1.5, float(np.float32(ml_dtypes.bfloat16(0.1))), -3.0]
        status, doc = post(
            srv.url, "out", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.5, 0.1, -3]}]}
        )
        assert status == 200 and doc["outputs"][0]["datatype"] == "BF16"
        # The runtime's own fp32 -> bf16 conversion: round-to-nearest-even on some CPU code paths, truncation on
        # others (OpenVINO on an AVX2-only EPYC). The expectation is what the installed runtime returns directly,
        # and it must be one of 0.1's two bf16 neighbours.
        direct = get(provider).open_session(tmp_path / "out.onnx").run({"x": np.array([[1.5, 0.1, -3]], np.float32)})
        runtime_says = [float(v) for v in np.asarray(direct["y"]).astype(np.float32).ravel()]
        assert runtime_says[1] in (0.099609375, 0.10009765625), runtime_says
        assert doc["outputs"][0]["data"] == [1.5, runtime_says[1], -3.0]
    finally:
        srv.shutdown(10)
        reg.close()


def test_bf16_model_qualifies_with_matching_datatypes(tmp_path):
    pkg = tmp_path / "bf16"
    pkg.mkdir()
    onnx.save(cast_model(TensorProto.BFLOAT16, TensorProto.FLOAT), pkg / "model.onnx")
    x = np.array([[1.5, 0.1, -3.0]], dtype=ml_dtypes.bfloat16)
    ds = pkg / "test_data_set_0"
    ds.mkdir()
    from onnx import numpy_helper

    (ds / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    (ds / "output_0.pb").write_bytes(numpy_helper.from_array(x.astype(np.float32), "y").SerializeToString())
    d = qualify(pkg, PROFILE, get_target("generic-x86_64"), providers=_providers(), options=FAST)
    for row in d.results:
        assert row.status == "passed", row.reason


class _Spec:
    def __init__(self, name: str, dtype: str):
        self.name, self.dtype = name, dtype


class _Ports:
    """What a session advertises (names and dtypes only): the contract check reads nothing else."""

    def __init__(self, inputs, outputs):
        self.inputs, self.outputs = inputs, outputs


def test_contract_names_a_provider_that_relabels_bf16():
    declared = {"inputs": [{"name": "x", "dtype": "bfloat16"}], "outputs": [{"name": "y", "dtype": "float32"}]}
    wrong = _Ports([_Spec("x", "float16")], [_Spec("y", "float32")])
    assert io.contract_problems(declared, wrong) == ["input 'x' is float16 on this provider but bfloat16 in the model"]
    assert io.result_problems(declared, {"y": np.zeros(2, np.float16)}) == [
        "output 'y' comes back as float16, the model declares float32"
    ]
    assert io.contract_problems(declared, _Ports([_Spec("x", "bfloat16")], [_Spec("y", "float32")])) == []


def test_a_bare_bf16_model_gets_seeded_bf16_inputs(tmp_path):
    """No golden data: seeded bfloat16 inputs, ORT CPU reference, every provider's datatypes checked."""
    onnx.save(cast_model(TensorProto.BFLOAT16, TensorProto.FLOAT), tmp_path / "bare.onnx")
    d = qualify(tmp_path / "bare.onnx", PROFILE, get_target("generic-x86_64"), providers=_providers(), options=FAST)
    assert d.reference.startswith(("onnx-reference-evaluator", "onnxruntime-cpu-fp32"))
    for row in d.results:
        assert row.status == "passed", row.reason
        assert row.accuracy["max_abs"] == 0.0  # a Cast of bf16 values to float is exact everywhere
