"""OpenVINO coverage is measured (query_model + runtime graph), per device, by ONNX node; never assumed."""

from __future__ import annotations

import pytest

pytest.importorskip("openvino")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from agent.errors import ProviderError  # noqa: E402
from agent.providers import get, ov_coverage  # noqa: E402
from agent.providers.openvino import _core  # noqa: E402
from agent.samples import cnn_model  # noqa: E402


def _partly_supported(path):
    """Relu -> Binarizer (ai.onnx.ml: OpenVINO's ONNX frontend has no rule for it) -> Sigmoid."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Binarizer", ["a"], ["b"], domain="ai.onnx.ml", name="binarize", threshold=0.5),
        helper.make_node("Sigmoid", ["b"], ["y"], name="sigmoid"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "partial", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
    )
    onnx.save(model, path)
    return path


def test_single_device_row_says_how_its_coverage_was_measured(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn_model(), path)
    a = get("openvino").open_session(path, precision="f32", device="CPU").assignment()
    assert a.nodes_total == 9 and a.coverage == 1.0
    assert a.method.startswith("openvino-query-model+runtime-graph on CPU: ")
    assert a.per_device == {"CPU": 9}  # every node of the sample CNN maps to ops the CPU plugin claims
    assert "seen in the runtime graph" in a.method


@pytest.mark.parametrize("device", ["CPU", "HETERO:CPU", "AUTO:CPU"])
def test_partly_supported_graph_is_below_full_coverage_with_the_op_named(tmp_path, device):
    path = _partly_supported(tmp_path / "partial.onnx")
    a = ov_coverage.measure_partial(_core(), path, device)
    assert a.nodes_total == 3
    assert a.nodes_on_provider == 2 and a.coverage is not None and a.coverage < 1.0
    assert a.fallback_ops == ("Binarizer",)
    # the devices are query_model's answer: HETERO names the device per op, AUTO answers for itself
    assert sum(a.per_device.values()) == 2 and set(a.per_device) <= {"CPU", "AUTO"}
    if device.startswith("HETERO"):
        assert a.per_device == {"CPU": 2}
    assert "1 taken by no device" in a.method


def test_session_error_on_a_partial_graph_carries_the_measured_coverage(tmp_path):
    path = _partly_supported(tmp_path / "partial.onnx")
    with pytest.raises(ProviderError, match="Binarizer") as info:
        get("openvino").open_session(path, device="CPU")
    a = info.value.assignment  # type: ignore[attr-defined]
    assert a.coverage == pytest.approx(2 / 3) and a.fallback_ops == ("Binarizer",)


def test_a_query_that_cannot_run_says_not_measured_never_full(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn_model(), path)
    from agent.providers.openvino import _read_model

    model = _read_model(_core(), path)
    a = ov_coverage.measure(_core(), model, None, "NO_SUCH_DEVICE", path)
    assert a.coverage is None and a.nodes_on_provider is None
    assert a.method.startswith("not measured: query_model on NO_SUCH_DEVICE failed")


def test_a_qualify_row_on_a_split_device_list_reports_per_device_counts(tmp_path):
    """A target may list a split device string; its row's coverage comes from query_model on that string."""
    import dataclasses

    from agent.hardware import detect
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions
    from agent.targets import ProviderPref, get_target

    path = tmp_path / "cnn.onnx"
    onnx.save(cnn_model(), path)
    # this host's own profile: on a CPU with bf16 (avx512_bf16, AMX) OpenVINO runs bf16 by default and the harness
    # adds the f32 row only when the profile says so (a made-up profile without flags once failed the bf16 row here)
    profile = detect()
    base = get_target("generic-x86_64")
    target = dataclasses.replace(base, providers=(ProviderPref("openvino", {"devices": ["CPU", "HETERO:CPU"]}),))
    d = qualify(
        path, profile, target, providers=["openvino"], options=QualifyOptions(latency_budget_s=0.05, row_timeout_s=120)
    )
    rows = {r.key: r for r in d.results}
    assert set(rows) >= {"openvino@CPU", "openvino@HETERO:CPU"}, rows.keys()
    passed = [r for k, r in rows.items() if k.startswith("openvino@HETERO:CPU") and r.status == "passed"]
    assert passed, {k: r.reason for k, r in rows.items()}
    split = passed[0]
    assert split.assignment["per_device"] == {"CPU": 9} and split.coverage == 1.0
    assert split.assignment["method"].startswith("openvino-query-model+runtime-graph on HETERO:CPU: ")
