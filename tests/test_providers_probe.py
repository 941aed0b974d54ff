"""Probes on hand-built profiles of real device classes (the runtimes are this host's), and ranking."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hostruntime import ort_openvino_devices

from agent.hardware.profile import Accelerator, CpuInfo, HardwareProfile
from agent.providers import PROVIDER_NAMES, get
from agent.providers.ranking import rank
from agent.targets import ProviderPref


def _ort_has(ep: str) -> bool:
    """What the installed onnxruntime itself reports (GPU, Core ML builds have these EPs compiled in)."""
    import onnxruntime

    return ep in onnxruntime.get_available_providers()


def _qnn_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime_qnn") is not None


AMD = HardwareProfile(
    arch="x86_64", cpu=CpuInfo(vendor="AMD", model="AMD EPYC", cores=2, flags=("avx2", "avx512_bf16"))
)
ORIN = HardwareProfile(
    arch="aarch64",
    cpu=CpuInfo(vendor="ARM", model="6x Cortex-A78AE", cores=6, flags=("asimd", "asimdhp")),
    accelerators=(Accelerator("gpu", "nvidia", "ga10b", "/sys/class/devfreq/17000000.gpu"),),
    software={"l4t": "36.4.3", "jetpack": "6.2"},
)
NANO = HardwareProfile(
    arch="aarch64",
    cpu=CpuInfo(vendor="ARM", cores=4),
    accelerators=(Accelerator("gpu", "nvidia", "gm20b"),),
    software={"l4t": "32.7.4", "jetpack": "4.6.4"},
)
X86_NVIDIA = HardwareProfile(
    arch="x86_64",
    cpu=CpuInfo(vendor="Intel", cores=16),
    accelerators=(Accelerator("gpu", "nvidia", "NVIDIA RTX 4000 Ada"),),
)
QCS6490 = HardwareProfile(
    arch="aarch64",
    cpu=CpuInfo(vendor="ARM", cores=8),
    accelerators=(Accelerator("dsp", "qualcomm", "Hexagon cDSP", "/dev/fastrpc-cdsp"),),
)
MAC = HardwareProfile(arch="aarch64", os="macOS 14.5", cpu=CpuInfo(vendor="Apple", model="Apple M2 Pro", cores=10))
PI5 = HardwareProfile(arch="aarch64", cpu=CpuInfo(vendor="ARM", model="4x Cortex-A76", cores=4, flags=("asimd",)))
NUC = HardwareProfile(
    arch="x86_64",
    cpu=CpuInfo(vendor="Intel", cores=16, flags=("avx2", "avx_vnni")),
    accelerators=(
        Accelerator("gpu", "intel", "Arc Graphics", "/dev/dri/renderD128"),
        Accelerator("npu", "intel", "Intel AI Boost", "/dev/accel/accel0"),
    ),
)
EMPTY = HardwareProfile()


@dataclasses.dataclass(frozen=True)
class _Target:  # the two fields rank() reads from agent.targets.Target
    name: str
    providers: tuple


@pytest.mark.parametrize("profile", [AMD, ORIN, NANO, X86_NVIDIA, QCS6490, MAC, PI5, NUC, EMPTY])
@pytest.mark.parametrize("name", PROVIDER_NAMES)
def test_probe_never_raises_and_explains(name, profile):
    res = get(name).probe(profile, {"some_option": 1})
    assert res.name == name
    assert res.reason
    if not res.available:
        assert res.remedy, f"{name} unavailable without a remedy: {res.reason}"
        assert res.devices == ()
    json.dumps(res.to_dict())


def test_cpu_is_always_available():
    for p in (AMD, ORIN, PI5, EMPTY):
        res = get("cpu").probe(p)
        assert res.available and res.devices == ("CPU",)
    assert "KleidiAI" in get("cpu").probe(PI5).reason


def test_openvino_devices_follow_the_hardware():
    res = get("openvino").probe(NUC)
    assert res.available and res.devices == ("CPU", "GPU", "NPU")
    assert "this host sees CPU" in res.reason  # the runtime here has no Intel GPU/NPU: said, not hidden
    assert get("openvino").probe(AMD).devices == ("CPU",)
    assert not get("openvino").probe(EMPTY).available


def test_ort_openvino_says_why_it_has_no_device_on_amd():
    res = get("ort-openvino").probe(AMD)
    if ort_openvino_devices():  # the probe reads this host's runtime: an Intel host's plugin lists its CPU
        assert res.available and res.devices == ort_openvino_devices(), res.reason
        return
    assert not res.available
    assert res.reason == (
        "onnxruntime-ep-openvino enumerates Intel devices only (vendor 0x8086); this CPU is AuthenticAMD"
    )
    assert "`openvino`" in res.remedy and "onnxruntime-openvino" in res.remedy
    assert res.versions.get("onnxruntime-ep-openvino")


def test_ort_openvino_on_aarch64_points_to_native_openvino():
    res = get("ort-openvino").probe(PI5)
    assert not res.available and "x86_64" in res.reason and "openvino" in res.remedy


@pytest.mark.parametrize("name", ["tensorrt", "cuda"])
def test_nvidia_eps_distinguish_hardware_from_runtime(name):
    label = {"tensorrt": "TensorRT", "cuda": "CUDA"}[name]
    no_gpu = get(name).probe(AMD)
    assert not no_gpu.available and no_gpu.reason.startswith("no NVIDIA GPU in this profile")
    orin = get(name).probe(ORIN)
    if _ort_has(get(name).ep_name):  # onnxruntime-gpu installed here: the runtime half of the probe passes
        assert orin.available, orin.reason
        return
    assert not orin.available and orin.reason.startswith(f"{label} EP not in this onnxruntime build")
    assert "Jetson AI Lab" in orin.remedy and "JetPack 6.2" in orin.remedy and "CUDA 12.6" in orin.remedy
    nano = get(name).probe(NANO)
    assert "JetPack 4" in nano.remedy and "old onnxruntime" in nano.remedy
    x86 = get(name).probe(X86_NVIDIA)
    assert "pip" in x86.remedy and "onnxruntime-gpu" in x86.remedy and "Jetson" not in x86.remedy


def test_qnn_needs_the_dsp_and_the_plugin():
    assert "fastrpc-cdsp" in get("qnn").probe(PI5).reason
    res = get("qnn").probe(QCS6490)
    if _qnn_installed() and res.available:  # the plugin is here and lists an HTP device
        return
    assert not res.available and "onnxruntime-qnn" in res.reason + res.remedy
    assert "pip install onnxruntime-qnn" in res.remedy and "3.11-3.13" in res.remedy


def test_coreml_needs_macos_arm64_without_rosetta():
    assert "macOS" in get("coreml").probe(AMD).reason
    rosetta = dataclasses.replace(MAC, arch="x86_64", software={"rosetta": True})
    assert "Rosetta" in get("coreml").probe(rosetta).reason
    res = get("coreml").probe(MAC)
    if _ort_has("CoreMLExecutionProvider"):  # the macOS arm64 wheel has it compiled in
        assert res.available, res.reason
        return
    assert not res.available and res.reason.startswith("Core ML EP not in this onnxruntime build")


@pytest.mark.parametrize("name, flag", [("acl", "--use_acl"), ("xnnpack", "--use_xnnpack")])
def test_acl_and_xnnpack_are_not_in_pip_wheels(name, flag):
    res = get(name).probe(PI5)
    if _ort_has(get(name).ep_name):  # a custom build with it compiled in
        return
    assert not res.available and "not in this onnxruntime build" in res.reason
    assert flag in res.remedy and "KleidiAI" in res.remedy


def test_rank_follows_the_target_then_the_rest():
    target = _Target(
        "jetson-orin", (ProviderPref("tensorrt", {"trt_fp16_enable": True}), ProviderPref("cuda"), ProviderPref("cpu"))
    )
    results = rank(ORIN, target)
    assert [r.name for r in results[:3]] == ["tensorrt", "cuda", "cpu"]
    assert sorted(r.name for r in results) == sorted(PROVIDER_NAMES)
    assert [r.preferred for r in results] == [True] * 3 + [False] * (len(PROVIDER_NAMES) - 3)
    assert results[0].options == {"trt_fp16_enable": True}
    assert results[0].reason.startswith("TensorRT EP not in this onnxruntime build")
    assert results[2].available


def test_rank_reports_unknown_provider_names_in_a_target():
    results = rank(AMD, _Target("odd", (ProviderPref("hailo"), ProviderPref("cpu"))))
    assert results[0].name == "hailo" and not results[0].available and "unknown provider" in results[0].reason
    assert results[1].name == "cpu" and results[1].available


def test_rank_without_a_target_lists_every_provider_unpreferred():
    results = rank(AMD, None)
    assert [r.name for r in results] == list(PROVIDER_NAMES)
    assert not any(r.preferred for r in results)
