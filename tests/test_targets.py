"""Target profiles: every pinned YAML loads and validates; matching, tolerances, features, errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from agent import sysroots as captures
from agent.errors import ConfigError
from agent.hardware.profile import Accelerator, CpuInfo, HardwareProfile
from agent.providers import PROVIDER_NAMES
from agent.targets import Tolerance, features_for, get_target, load_targets, match
from agent.targets import detect_device as detect  # detection plus the matched target

TARGETS = Path(__file__).resolve().parent.parent / "targets"
SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
PINNED = {
    "raspberry-pi-4",
    "raspberry-pi-5",
    "jetson-orin",
    "jetson-xavier",
    "jetson-nano",
    "intel-x86_64",
    "qualcomm-snapdragon",
    "apple-silicon",
    "generic-aarch64",
    "generic-x86_64",
}


def test_pinned_targets_load():
    targets = load_targets()
    assert set(targets) == PINNED
    for t in targets.values():
        assert t.description and t.providers[-1].name == "cpu", t.name
        assert all(p.name in PROVIDER_NAMES for p in t.providers)
        assert t.serving["swap"] in ("make-before-break", "stop-then-start") and t.serving["memory_max"]
        for prec in ("fp32", "fp16", "bf16", "int8"):
            tol = t.tolerance("cpu", prec)
            assert 0 < tol.max_rel <= 0.1 and 0.9 <= tol.min_cosine <= 1 and 0.9 <= tol.top1_agreement <= 1


@pytest.mark.parametrize(
    "name, first, options",
    [
        ("jetson-orin", "tensorrt", {"trt_fp16_enable": True, "trt_engine_cache_enable": True}),
        ("intel-x86_64", "openvino", {"devices": ["NPU", "GPU", "CPU"]}),
        ("generic-x86_64", "openvino", {"devices": ["CPU"]}),
        ("raspberry-pi-5", "xnnpack", {}),
        ("qualcomm-snapdragon", "qnn", {"backend_type": "htp"}),
        ("apple-silicon", "coreml", {"ModelFormat": "MLProgram", "MLComputeUnits": "ALL"}),
    ],
)
def test_provider_preferences(name, first, options):
    t = get_target(name)
    assert t.providers[0].name == first
    assert options.items() <= t.providers[0].options.items()
    assert t.provider_options(first) == dict(t.providers[0].options)


def test_provider_order():
    assert get_target("jetson-orin").provider_names == ("tensorrt", "cuda", "openvino", "cpu")
    assert get_target("intel-x86_64").provider_names == ("openvino", "ort-openvino", "cpu")
    assert get_target("raspberry-pi-4").provider_names == ("xnnpack", "acl", "openvino", "cpu")


def test_tolerance_fallback_and_aliases():
    orin = get_target("jetson-orin")
    # tensorrt with trt_fp16_enable: fp32 requests are judged by fp16-like bounds; other precisions fall back
    assert orin.tolerance("tensorrt", "fp32").max_rel == orin.tolerance("default", "fp16").max_rel
    assert orin.tolerance("tensorrt", "int8") == orin.tolerance("cpu", "int8")
    assert orin.tolerance("cpu", None) == orin.tolerance("cpu", "f32") == orin.tolerance("cpu", "FP32")
    assert orin.tolerances("cuda", "bf16") == orin.tolerance("cuda", "bfloat16")
    qnn = get_target("qualcomm-snapdragon").tolerance("qnn", "int8")
    assert qnn.max_abs == get_target("qualcomm-snapdragon").tolerance("cpu", "int8").max_abs  # inherited key
    assert qnn.min_cosine == 0.98
    with pytest.raises(ConfigError, match="unknown precision 'int4'"):
        orin.tolerance("cpu", "int4")


def test_tolerance_ordering_is_sane():
    t = get_target("generic-x86_64")
    rels = [t.tolerance("cpu", p).max_rel for p in ("fp32", "fp16", "bf16", "int8")]
    assert rels == sorted(rels)
    tol = Tolerance(max_abs=1e-4, max_rel=1e-3, min_cosine=0.9999, top1_agreement=0.99)
    assert tol.allows(0.005, scale=10.0) and not tol.allows(0.02, scale=10.0)


def test_get_target_unknown_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        get_target("jetson-thor")
    assert "jetson-thor" in str(err.value) and "raspberry-pi-5" in str(err.value)


def profile(**kw) -> HardwareProfile:
    return HardwareProfile(**kw)


def test_match_rules_and_fallbacks():
    assert match(profile(arch="x86_64", cpu=CpuInfo(vendor="AMD"))).name == "generic-x86_64"
    assert match(profile(arch="x86_64", cpu=CpuInfo(vendor="Intel"))).name == "intel-x86_64"
    assert match(profile(arch="aarch64", soc="rk3588")).name == "generic-aarch64"
    assert (
        match(profile(arch="aarch64", software={"dt_compatible": ["thundercomm,rubikpi3", "qcom,qcs6490"]})).name
        == "qualcomm-snapdragon"
    )
    assert match(profile(arch="aarch64", os="macOS 15.1")).name == "apple-silicon"
    assert match(profile(arch="x86_64", os="macOS 13.6", cpu=CpuInfo(vendor="Intel"))).name == "intel-x86_64"
    assert match(profile()).name.startswith("generic-")


@pytest.mark.parametrize(
    "sysroot, expected",
    [
        ("rpi4-4gb", "raspberry-pi-4"),
        ("rpi5-8gb", "raspberry-pi-5"),
        ("rpi5-hailo8l", "raspberry-pi-5"),
        ("jetson-nano-jp4", "jetson-nano"),
        ("jetson-orin-nano-jp6", "jetson-orin"),
        ("jetson-agx-xavier-jp5", "jetson-xavier"),
        ("intel-nuc-meteorlake", "intel-x86_64"),
        ("intel-avx2-only", "intel-x86_64"),
        ("amd-epyc-x86", "generic-x86_64"),
        ("qualcomm-qcs6490", "qualcomm-snapdragon"),
        ("apple-m2", "apple-silicon"),
    ],
)
def test_match_fixture(sysroot, expected):
    assert match(detect(SYSROOTS / sysroot)).name == expected


def test_features_for_reflects_the_device():
    nuc = detect(SYSROOTS / "intel-nuc-meteorlake")
    f = features_for(nuc, get_target("intel-x86_64"))
    assert {"openvino", "avx2", "avx_vnni", "gpu", "npu", "intel-npu", "intel-gpu", "x86_64"} <= f
    assert "avx512_bf16" not in f
    old = features_for(detect(SYSROOTS / "intel-avx2-only"), get_target("intel-x86_64"))
    assert "npu" not in old and "avx2" in old and "avx_vnni" not in old
    epyc = features_for(detect(SYSROOTS / "amd-epyc-x86"), get_target("generic-x86_64"))
    assert {"avx512_bf16", "avx512f"} <= epyc and "gpu" not in epyc
    pi4 = features_for(detect(SYSROOTS / "rpi4-4gb"), get_target("raspberry-pi-4"))
    pi5 = features_for(detect(SYSROOTS / "rpi5-hailo8l"), get_target("raspberry-pi-5"))
    assert "neon" in pi4 and "fp16" not in pi4 and {"fp16", "dotprod", "npu", "hailo-npu"} <= pi5
    orin = features_for(detect(SYSROOTS / "jetson-orin-nano-jp6"), get_target("jetson-orin"))
    assert {"cuda", "tensorrt", "gpu", "nvidia-gpu"} <= orin
    m2 = features_for(detect(SYSROOTS / "apple-m2"), get_target("apple-silicon"))
    assert {"coreml", "neon", "fp16", "i8mm", "npu"} <= m2
    prof = HardwareProfile(arch="aarch64", accelerators=(Accelerator("tpu", "google", "Coral", "/dev/apex_0"),))
    assert "tpu" in features_for(prof, get_target("generic-aarch64"))


@pytest.fixture
def target_dir(tmp_path):
    d = tmp_path / "targets"
    shutil.copytree(TARGETS, d)
    return d


def edit(d: Path, name: str, change) -> None:
    path = d / f"{name}.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda d: d["providers"].append({"name": "tpu-magic"}), "providers[4].name"),
        (lambda d: d["tolerances"]["default"].pop("bf16"), "tolerances.default.bf16"),
        (lambda d: d["tolerances"]["default"]["fp32"].update(min_cosine=1.5), "tolerances.default.fp32.min_cosine"),
        (lambda d: d["tolerances"].update(tensorrt={"fp8": {"max_rel": 0.1}}), "tolerances.tensorrt.fp8"),
        (lambda d: d["serving"].update(swap="hot"), "serving.swap"),
        (lambda d: d["match"].update(arch="riscv64"), "match.arch"),
        (lambda d: d["match"].update(colour="green"), "match.colour"),
        (lambda d: d.update(name="rpi"), "name"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["providers"][0].update(options=[1]), "providers[0].options"),
    ],
)
def test_bad_yaml_names_file_and_key(target_dir, change, key):
    edit(target_dir, "raspberry-pi-4", change)
    with pytest.raises(ConfigError) as err:
        load_targets(target_dir)
    assert str(err.value).startswith(f"raspberry-pi-4.yaml: {key}:"), str(err.value)


def test_unparseable_yaml(target_dir):
    (target_dir / "jetson-nano.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"^jetson-nano.yaml: line 2 column 1 invalid YAML"):
        load_targets(target_dir)


def test_env_directory_and_custom_target(target_dir, monkeypatch):
    edit(target_dir, "generic-aarch64", lambda d: d.update(description="custom fleet default"))
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(target_dir))
    assert get_target("generic-aarch64").description == "custom fleet default"
    assert match(profile(arch="aarch64")).description == "custom fleet default"
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(target_dir / "nope"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_targets()


def test_detect_notes_a_broken_targets_directory(target_dir, monkeypatch):
    (target_dir / "jetson-nano.yaml").write_text("name: [unclosed\n")
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(target_dir))
    prof = detect(SYSROOTS / "rpi4-4gb")
    assert prof.target is None and any("jetson-nano.yaml" in n for n in prof.notes)


def test_target_to_dict_round_trips_json():
    import json

    d = json.loads(json.dumps(get_target("jetson-orin").to_dict()))
    assert d["providers"][0]["name"] == "tensorrt" and d["tolerances"]["tensorrt"]["fp32"]["max_rel"] == 0.02


def test_detection_is_pure_and_the_target_comes_from_targets():
    from agent.hardware import detect as pure_detect
    from agent.targets import resolve

    raw = pure_detect(SYSROOTS / "rpi4-4gb")
    assert raw.target is None and raw.arch == "aarch64"  # hardware/ reads; it does not choose a target
    assert detect(SYSROOTS / "rpi4-4gb").target == "raspberry-pi-4" == resolve(raw).name
    assert resolve(raw, "generic-aarch64").name == "generic-aarch64" and resolve(raw, "auto").name == "raspberry-pi-4"
