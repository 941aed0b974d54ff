"""Real sessions on the providers this machine has: cpu (ONNX Runtime) and openvino (native)."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

from agent import samples
from agent.errors import ProviderError
from agent.hardware import detect
from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.providers import get
from agent.providers._common import has_bf16

AMD_BF16 = HardwareProfile(
    arch="x86_64",
    os="Debian GNU/Linux 12 (bookworm)",
    cpu=CpuInfo(
        vendor="AuthenticAMD", model="AMD EPYC 9R14", cores=2, flags=("sse4_2", "avx2", "avx512f", "avx512_bf16")
    ),
)
AVX2_ONLY = HardwareProfile(
    arch="x86_64",
    cpu=CpuInfo(vendor="GenuineIntel", model="Intel(R) Core(TM) i5-8259U", cores=8, flags=("sse4_2", "avx2")),
)


HOST_BF16 = has_bf16(detect("/"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    cnn, ml = samples.cnn_model(), samples.ml_model()
    onnx.save(cnn, d / "cnn.onnx")
    onnx.save(ml, d / "ml.onnx")
    feeds = samples.seeded_feeds(cnn)
    return {
        "cnn": d / "cnn.onnx",
        "ml": d / "ml.onnx",
        "feeds": feeds,
        "golden": samples.reference_outputs(cnn, feeds)[0],
        "dir": d,
    }


@pytest.mark.parametrize("name", ["cpu", "openvino"])
def test_probe_available_here(name):
    res = get(name).probe(AMD_BF16)
    assert res.available, res.reason
    assert res.devices[0] == "CPU"
    assert res.versions and all(res.versions.values())
    assert res.to_dict()["devices"] == list(res.devices)


@pytest.mark.parametrize("name", ["cpu", "openvino"])
def test_session_runs_cnn_and_matches_reference(name, models):
    sess = get(name).open_session(models["cnn"], precision="f32")
    out = sess.run(models["feeds"])
    assert set(out) == {"probabilities"}
    np.testing.assert_allclose(out["probabilities"], models["golden"], atol=1e-5, rtol=1e-4)
    assert [i.name for i in sess.inputs] == ["input"] and sess.inputs[0].dtype == "float32"
    assert sess.outputs[0].name == "probabilities" and sess.outputs[0].shape[1] == 10
    assert sess.precision == "f32" and sess.compile_s > 0
    a = sess.assignment()
    assert a.nodes_total and a.coverage == 1.0 and a.fallback_ops == ()
    assert a.method in ("ort-graph-assignment", "ort-profiling") or a.method.startswith("openvino-query-model")


def test_cpu_assignment_is_measured_by_ort(models):
    a = get("cpu").open_session(models["cnn"]).assignment()
    assert a.method == "ort-graph-assignment" and a.devices == ("CPUExecutionProvider",)


def test_openvino_default_precision_is_reported_as_really_used(models):
    prov = get("openvino")
    assert prov.precisions(AMD_BF16) == [None, "f32"]
    assert prov.precisions(AVX2_ONLY) == [None]
    default = prov.open_session(models["cnn"])
    f32 = prov.open_session(models["cnn"], precision="f32")
    assert f32.precision == "f32" and "bf16" not in f32.runtime_precisions()
    err_f32 = np.abs(f32.run(models["feeds"])["probabilities"] - models["golden"]).max()
    assert err_f32 < 1e-5
    assert default.assignment().devices == ("CPU",)
    if not HOST_BF16:  # a CPU without avx512_bf16/AMX: the default is f32 and says so
        assert default.precision == "f32"
        return
    # this machine has avx512_bf16: OpenVINO's CPU plugin picks bf16, and it really changes the numbers
    assert default.precision == "bf16" and "bf16" in default.runtime_precisions()
    err_default = np.abs(default.run(models["feeds"])["probabilities"] - models["golden"]).max()
    assert err_default > 1e-5


def test_openvino_names_the_unsupported_ml_op(models):
    with pytest.raises(ProviderError, match=r"unsupported operator\(s\) ai\.onnx\.ml\.Scaler"):
        get("openvino").open_session(models["ml"])


def test_cpu_runs_the_ml_op(models):
    sess = get("cpu").open_session(models["ml"])
    out = sess.run({"x": np.array([[0.0, 0.5, 1.0, 2.0]], dtype=np.float32)})
    np.testing.assert_allclose(out["y"], [[0.0, 0.0, 1.0, 3.0]])


def test_openvino_cache_dir_is_filled(models, tmp_path):
    cache = tmp_path / "ovcache"
    get("openvino").open_session(models["cnn"], precision="f32", cache_dir=cache)
    assert any(cache.iterdir())


@pytest.mark.parametrize("name", ["cpu", "openvino"])
def test_run_is_thread_safe(name, models):
    sess = get(name).open_session(models["cnn"], precision="f32")
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((2, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    expected = [sess.run({"input": b})["probabilities"] for b in batches]
    errors: list[str] = []

    def worker(k):
        for i in range(10):
            j = (k + i) % len(batches)
            got = sess.run({"input": batches[j]})["probabilities"]
            if not np.allclose(got, expected[j], atol=1e-6):
                errors.append(f"thread {k} batch {j}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors


@pytest.mark.parametrize("name", ["cpu", "openvino"])
def test_missing_and_corrupt_models_raise_provider_error(name, models, tmp_path):
    with pytest.raises(ProviderError, match="not found"):
        get(name).open_session(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(ProviderError, match=name):
        get(name).open_session(bad)


def test_bad_options_and_precisions_are_clear_errors(models):
    with pytest.raises(ProviderError, match="unknown option"):
        get("cpu").open_session(models["cnn"], options={"trt_fp16_enable": True})
    with pytest.raises(ProviderError, match="precision"):
        get("cpu").open_session(models["cnn"], precision="int4")
    with pytest.raises(ProviderError, match="precision"):
        get("openvino").open_session(models["cnn"], precision="int4")
    with pytest.raises(ProviderError, match="openvino"):
        get("openvino").open_session(models["cnn"], device="NPU")


def test_cpu_session_options_apply(models):
    sess = get("cpu").open_session(
        models["cnn"], options={"intra_op_num_threads": 1, "graph_optimization_level": "disable"}
    )
    out = sess.run(models["feeds"])["probabilities"]
    np.testing.assert_allclose(out, models["golden"], atol=1e-5)
    # with optimisations off, every ONNX node stays a node
    assert sess.assignment().nodes_total == len(samples.cnn_model().graph.node)


def test_openvino_unknown_input_is_a_clear_error(models):
    sess = get("openvino").open_session(models["cnn"], precision="f32")
    with pytest.raises(ProviderError, match="unknown input"):
        sess.run({"image": models["feeds"]["input"]})


def test_profiling_fallback_measures_assignment_from_the_trace(models, monkeypatch):
    """ORT builds without get_provider_graph_assignment_info: the profiling trace's args.provider is used."""
    from agent.providers import _ort

    monkeypatch.setattr(_ort, "can_record_assignment", lambda: False)
    sess = get("cpu").open_session(models["cnn"], options={"graph_optimization_level": "disable"})
    a = sess.assignment()  # no run yet: it runs zeros once to get a trace
    assert a.method == "ort-profiling"
    assert a.nodes_total == len(samples.cnn_model().graph.node) and a.coverage == 1.0


def test_closed_sessions_refuse_to_run(models):
    for name in ("cpu", "openvino"):
        sess = get(name).open_session(models["cnn"], precision="f32")
        sess.close()
        with pytest.raises(ProviderError, match="closed"):
            sess.run(models["feeds"])


def test_openvino_takes_the_targets_options(models):
    """targets/*.yaml write `devices: [NPU, GPU, CPU]` and `performance_hint: LATENCY`."""
    prov = get("openvino")
    opts = {"devices": ["NPU", "GPU", "CPU"], "performance_hint": "LATENCY"}
    sess = prov.open_session(models["cnn"], options=opts, precision="f32")
    assert sess.device == "CPU"  # the first preferred device this runtime has
    assert "LATENCY" in str(sess._compiled.get_property("PERFORMANCE_HINT"))
    res = prov.probe(AMD_BF16, opts)
    assert res.devices == ("CPU",) and res.options == opts
    with pytest.raises(ProviderError, match="NOT_A_PROPERTY|Unsupported property"):
        prov.open_session(models["cnn"], options={"not_a_property": 1})


def test_plugin_style_session_through_ep_devices(models):
    """The add_provider_for_devices path of plugin EPs, exercised with the CPU EP's own OrtEpDevice."""
    import onnxruntime as ort

    from agent.providers._ortep import OrtEpProvider

    class CpuViaDevices(OrtEpProvider):
        name, ep_name, label, devices, precision_default = "cpu-devices", "CPUExecutionProvider", "CPU", ("CPU",), "f32"

        def runtime_devices(self, profile):
            return [d for d in ort.get_ep_devices() if d.ep_name == self.ep_name], None

    prov = CpuViaDevices()
    assert prov.probe(AMD_BF16).devices == ("CPU",)
    sess = prov.open_session(models["cnn"], device="CPU")
    np.testing.assert_allclose(sess.run(models["feeds"])["probabilities"], models["golden"], atol=1e-5)
    assert sess.assignment().coverage == 1.0
    with pytest.raises(ProviderError, match="no GPU device"):
        prov.open_session(models["cnn"], device="GPU")


def test_ort_openvino_passes_everything_through_load_config(tmp_path):
    import json

    from agent.providers.ort_openvino import OrtOpenVINOProvider

    prov = OrtOpenVINOProvider()
    ep, used = prov.ep_options(
        {"devices": ["GPU"], "performance_hint": "LATENCY", "load_config": {"GPU": {"NUM_STREAMS": "2"}}},
        None,
        tmp_path / "c",
        "GPU",
    )
    assert used == "f32"
    assert json.loads(ep["load_config"]) == {
        "GPU": {
            "NUM_STREAMS": "2",
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
            "CACHE_DIR": str(tmp_path / "c"),
        }
    }
    plugin_ep, dev = prov.finalize(ep, ["a plugin device"], None)
    assert dev == "GPU" and "device_type" not in plugin_ep
    bundled_ep, _ = prov.finalize(ep, None, None)
    assert bundled_ep["device_type"] == "GPU"
    with pytest.raises(ProviderError, match="precision"):
        prov.ep_options({}, "int3", None)


def test_ort_ep_sessions_refuse_silent_cpu_fallback_unless_asked(models):
    """A non-CPU EP that cannot take a node must fail loudly (session.disable_cpu_ep_fallback=1), not hide on CPU."""
    import onnxruntime as ort

    from agent.providers._ortep import OrtEpProvider

    class AzureOnly(OrtEpProvider):  # the Azure EP ships in every wheel and runs no local node
        name, ep_name, label, devices = "azure", "AzureExecutionProvider", "Azure", ("CPU",)

    assert "AzureExecutionProvider" in ort.get_available_providers()
    with pytest.raises(ProviderError, match="azure: onnxruntime could not create a session"):
        AzureOnly().open_session(models["cnn"])
    sess = AzureOnly().open_session(models["cnn"], options={"cpu_fallback": True})
    a = sess.assignment()  # measured: every node fell back to ORT's CPU EP
    assert a.nodes_on_provider == 0 and a.coverage == 0.0 and "Conv" in a.fallback_ops
