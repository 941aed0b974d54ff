"""detect() on every captured sysroot: arch, board, cores, memory, accelerators, software, throttling, target."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent import sysroots as captures
from agent.targets import detect_device as detect  # detection plus the matched target

SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
NOT_DEVICES = Path(__file__).parent / "fixtures" / "sysroots"  # garbage, empty: test-only trees


def processors(name: str) -> int:
    return len(re.findall(r"^processor\s*:", (SYSROOTS / name / "proc/cpuinfo").read_text(), re.M))


def memtotal(name: str) -> int:
    return (
        int(re.search(r"^MemTotal:\s*(\d+) kB", (SYSROOTS / name / "proc/meminfo").read_text(), re.M).group(1)) * 1024
    )


def sysctl(name: str, key: str) -> str:
    """One `key: value` line of a macOS capture, read here without the product's parser."""
    text = (SYSROOTS / name / ".captures/sysctl.txt").read_text()
    return re.search(rf"^{re.escape(key)}: (.*)$", text, re.M).group(1)


# name -> expected fields. Counts and sizes are read from the capture's own files here (a plain regex, not the
# product's parser): cores = `processor` entries in /proc/cpuinfo, memory = MemTotal (kB) * 1024.
EXPECTED = {
    "rpi4-4gb": dict(
        arch="aarch64",
        board="Raspberry Pi 4 Model B Rev 1.1",
        soc="BCM2711",
        cores=processors("rpi4-4gb"),
        cpu="Cortex-A72",
        memory=memtotal("rpi4-4gb"),
        accels=set(),
        software={"pi_revision": "c03111"},
        target="raspberry-pi-4",
        os="Debian GNU/Linux 12 (bookworm)",
        throttling={
            "raw": "0x50000",
            "under_voltage": False,
            "under_voltage_occurred": True,
            "throttled_occurred": True,
            "soft_temp_limit_occurred": False,
        },
        temp=("cpu-thermal", 48.7),
    ),
    "rpi5-8gb": dict(
        arch="aarch64",
        board="Raspberry Pi 5 Model B Rev 1.0",
        soc="BCM2712",
        cores=processors("rpi5-8gb"),
        cpu="Cortex-A76",
        memory=memtotal("rpi5-8gb"),
        accels=set(),
        software={"pi_revision": "d04170"},
        target="raspberry-pi-5",
        os="Debian GNU/Linux 12 (bookworm)",
        throttling={"raw": "0x0", "throttled": False},
        temp=("cpu-thermal", 52.4),
    ),
    "rpi5-hailo8l": dict(
        arch="aarch64",
        board="Raspberry Pi 5 Model B Rev 1.0",
        soc="BCM2712",
        cores=processors("rpi5-hailo8l"),
        cpu="Cortex-A76",
        memory=memtotal("rpi5-hailo8l"),
        accels={("npu", "hailo", "/dev/hailo0")},
        software={"pi_revision": "c04170"},
        target="raspberry-pi-5",
        os="Debian GNU/Linux 12 (bookworm)",
        throttling={"raw": "0x80008", "soft_temp_limit": True, "soft_temp_limit_occurred": True, "throttled": False},
        temp=("cpu-thermal", 81.2),
    ),
    "jetson-nano-jp4": dict(
        arch="aarch64",
        board="NVIDIA Jetson Nano Developer Kit",
        soc="tegra210",
        cores=processors("jetson-nano-jp4"),
        cpu="Cortex-A57",
        memory=memtotal("jetson-nano-jp4"),
        accels={("gpu", "nvidia", "/sys/class/devfreq/57000000.gpu")},
        software={"l4t": "32.7.4", "jetpack": "4.6.4", "jetson_module": "Jetson Nano"},
        target="jetson-nano",
        os="Ubuntu 18.04.6 LTS",
        throttling={},
        temp=("CPU-therm", 41.5),
    ),
    "jetson-orin-nano-jp6": dict(
        arch="aarch64",
        board="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        soc="tegra234",
        cores=processors("jetson-orin-nano-jp6"),
        cpu="Cortex-A78AE",
        memory=memtotal("jetson-orin-nano-jp6"),
        accels={("gpu", "nvidia", "/sys/class/devfreq/17000000.gpu")},
        software={
            "l4t": "36.4.3",
            "jetpack": "6.2",
            "power_mode": "MAXN_SUPER",
            "jetson_module": "Jetson Orin Nano 8GB",
        },
        target="jetson-orin",
        os="Ubuntu 22.04.5 LTS",
        throttling={},
        temp=("gpu-thermal", 44.1),
    ),
    "jetson-agx-xavier-jp5": dict(
        arch="aarch64",
        board="Jetson-AGX",
        soc="tegra194",
        cores=processors("jetson-agx-xavier-jp5"),
        cpu="Carmel",
        memory=memtotal("jetson-agx-xavier-jp5"),
        accels={
            ("gpu", "nvidia", "/sys/class/devfreq/17000000.gv11b"),
            ("npu", "nvidia", "dla0"),
            ("npu", "nvidia", "dla1"),
        },
        software={"l4t": "35.5.0", "jetpack": "5.1.3", "jetson_module": "Jetson AGX Xavier"},
        target="jetson-xavier",
        os="Ubuntu 20.04.6 LTS",
        throttling={},
        temp=("GPU-therm", 38.0),
    ),
    "intel-nuc-meteorlake": dict(
        arch="x86_64",
        board="NUC14RVH-B",
        soc=None,
        cores=processors("intel-nuc-meteorlake"),
        cpu="Intel(R) Core(TM) Ultra 5 125H",
        memory=memtotal("intel-nuc-meteorlake"),
        accels={("gpu", "intel", "/dev/dri/renderD128"), ("npu", "intel", "/dev/accel/accel0")},
        software={"kernel": "6.8.0-49-generic"},
        target="intel-x86_64",
        os="Ubuntu 24.04.1 LTS",
        throttling={},
        temp=("x86_pkg_temp", 47.0),
    ),
    "intel-avx2-only": dict(
        arch="x86_64",
        board="OptiPlex 3060",
        soc=None,
        cores=processors("intel-avx2-only"),
        cpu="Intel(R) Core(TM) i5-8500T CPU @ 2.10GHz",
        memory=memtotal("intel-avx2-only"),
        accels={("gpu", "intel", "/dev/dri/renderD128")},
        software={},
        target="intel-x86_64",
        os="Ubuntu 22.04.4 LTS",
        throttling={},
        temp=("x86_pkg_temp", 38.0),
    ),
    "amd-epyc-x86": dict(
        arch="x86_64",
        board="m7a.xlarge",
        soc=None,
        cores=processors("amd-epyc-x86"),
        cpu="AMD EPYC 9R14",
        memory=memtotal("amd-epyc-x86"),
        accels=set(),
        software={},
        target="generic-x86_64",
        os="Debian GNU/Linux 12 (bookworm)",
        throttling=None,
        temp=None,
    ),
    "qualcomm-qcs6490": dict(
        arch="aarch64",
        board="Qualcomm Technologies, Inc. Robotics RB3gen2",
        soc="QCS6490",
        cores=processors("qualcomm-qcs6490"),
        cpu="4x Cortex-A55 + 4x Cortex-A78",
        memory=memtotal("qualcomm-qcs6490"),
        accels={("dsp", "qualcomm", "/dev/fastrpc-cdsp"), ("gpu", "qualcomm", "/dev/kgsl-3d0")},
        software={},
        target="qualcomm-snapdragon",
        os="Ubuntu 24.04.2 LTS",
        throttling={},
        temp=("nspss0-thermal", 36.4),
    ),
    "apple-m2": dict(  # hand-built (agent/sysroots/README.md): expectations read from its own sysctl.txt
        arch="aarch64",
        board=sysctl("apple-m2", "hw.model"),
        soc=sysctl("apple-m2", "machdep.cpu.brand_string"),
        cores=int(sysctl("apple-m2", "hw.logicalcpu")),
        cpu=sysctl("apple-m2", "machdep.cpu.brand_string"),
        memory=int(sysctl("apple-m2", "hw.memsize")),
        accels={("gpu", "apple", None), ("npu", "apple", None)},
        software={"macos": sysctl("apple-m2", "kern.osproductversion"), "rosetta": False},
        target="apple-silicon",
        os=f"macOS {sysctl('apple-m2', 'kern.osproductversion')}",
        throttling=None,
        temp=None,
    ),
    # Captures added in the quality pass (devices no other fixture covers).
    "rpi-cm4-coral": dict(
        arch="aarch64",
        board="Raspberry Pi Compute Module 4 Rev 1.1",
        soc="BCM2711",
        cores=processors("rpi-cm4-coral"),
        cpu="Cortex-A72",
        memory=memtotal("rpi-cm4-coral"),
        accels={("tpu", "google", "/dev/apex_0")},
        software={"pi_revision": "d03141"},
        target="raspberry-pi-4",
        os="Debian GNU/Linux 12 (bookworm)",
        throttling={"raw": "0x0", "throttled": False},
        temp=("cpu-thermal", 51.1),
    ),
    "jetson-agx-orin-64gb-jp61": dict(
        arch="aarch64",
        board="NVIDIA Jetson AGX Orin Developer Kit",
        soc="tegra234",
        cores=processors("jetson-agx-orin-64gb-jp61"),
        cpu="Cortex-A78AE",
        memory=memtotal("jetson-agx-orin-64gb-jp61"),
        accels={
            ("gpu", "nvidia", "/sys/class/devfreq/17000000.gpu"),
            ("npu", "nvidia", "dla0"),
            ("npu", "nvidia", "dla1"),
        },
        software={"l4t": "36.4.0", "jetpack": "6.1", "power_mode": "MAXN", "jetson_module": "Jetson AGX Orin 64GB"},
        target="jetson-orin",
        os="Ubuntu 22.04.5 LTS",
        throttling={},
        temp=("tj-thermal", 48.2),
    ),
    "intel-lunarlake-npu": dict(
        arch="x86_64",
        board="ThinkPad X1 Carbon Gen 13",
        soc=None,
        cores=processors("intel-lunarlake-npu"),
        cpu="Intel(R) Core(TM) Ultra 7 258V",
        memory=memtotal("intel-lunarlake-npu"),
        accels={("gpu", "intel", "/dev/dri/renderD128"), ("npu", "intel", "/dev/accel/accel0")},
        software={"kernel": "6.11.0-19-generic"},
        target="intel-x86_64",
        os="Ubuntu 24.10",
        throttling={},
        temp=("x86_pkg_temp", 53.0),
    ),
    "apple-m3-max": dict(
        arch="aarch64",
        board=sysctl("apple-m3-max", "hw.targettype"),
        soc="Apple M3 Max",  # hw.cpufamily 1912690738 = 0x72015832 (PALMA)
        cores=int(sysctl("apple-m3-max", "hw.logicalcpu")),
        cpu="Apple M3 Max",
        memory=int(sysctl("apple-m3-max", "hw.memsize")),
        accels={("gpu", "apple", None), ("npu", "apple", None)},
        software={"rosetta": False},
        target="apple-silicon",
        os="macOS",
        throttling=None,
        temp=None,
    ),
    "ampere-altra-cax31": dict(
        arch="aarch64",
        board="vServer",
        soc=None,
        cores=processors("ampere-altra-cax31"),
        cpu="Neoverse-N1",
        memory=memtotal("ampere-altra-cax31"),
        accels=set(),
        software={"kernel": "6.8.0-51-generic"},
        target="generic-aarch64",
        os="Ubuntu 24.04.1 LTS",
        throttling=None,
        temp=None,
    ),
}


@pytest.fixture(scope="module")
def profiles():
    return {name: detect(SYSROOTS / name) for name in EXPECTED}


def test_every_fixture_has_expectations():
    assert set(captures.names()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_profile(profiles, name):
    exp, prof = EXPECTED[name], profiles[name]
    assert prof.arch == exp["arch"]
    assert prof.board is not None and prof.board.model == exp["board"]
    assert prof.soc == exp["soc"]
    assert prof.cpu.cores == exp["cores"]
    assert prof.cpu.model == exp["cpu"]
    assert prof.memory_bytes == exp["memory"]
    assert prof.os == exp["os"]
    assert {(a.kind, a.vendor, a.device) for a in prof.accelerators} == exp["accels"]
    assert exp["software"].items() <= prof.software.items()
    assert prof.target == exp["target"]
    assert prof.notes == ()
    if exp["throttling"] is None:
        assert prof.throttling is None
    else:
        assert exp["throttling"].items() <= prof.throttling.items()
    assert "PMIC-Die" not in ((prof.throttling or {}).get("temperatures_c") or {})
    if exp["temp"]:
        zone, degrees = exp["temp"]
        assert prof.throttling["temperatures_c"][zone] == degrees
    assert json.loads(json.dumps(prof.to_dict()))["target"] == exp["target"]


def test_pinned_json_keys(profiles):
    d = profiles["rpi5-hailo8l"].to_dict()
    assert list(d) == [
        "arch",
        "os",
        "cpu",
        "memory_bytes",
        "board",
        "soc",
        "accelerators",
        "software",
        "throttling",
        "target",
        "notes",
    ]
    assert set(d["cpu"]) == {"vendor", "model", "cores", "flags"}
    assert set(d["board"]) == {"vendor", "model"}
    assert d["accelerators"] == [{"kind": "npu", "vendor": "hailo", "name": "Hailo-8/8L", "device": "/dev/hailo0"}]


def test_flags_and_vendors(profiles):
    assert "avx_vnni" in profiles["intel-nuc-meteorlake"].cpu.flags
    assert not any(f.startswith("avx512") for f in profiles["intel-avx2-only"].cpu.flags)
    assert "avx2" in profiles["intel-avx2-only"].cpu.flags
    assert "avx512_bf16" in profiles["amd-epyc-x86"].cpu.flags
    assert profiles["amd-epyc-x86"].cpu.vendor == "AMD"
    assert profiles["intel-nuc-meteorlake"].cpu.vendor == "Intel"
    assert "asimdhp" in profiles["rpi5-8gb"].cpu.flags and "asimdhp" not in profiles["rpi4-4gb"].cpu.flags
    assert profiles["qualcomm-qcs6490"].cpu.vendor == "ARM"
    assert profiles["jetson-agx-xavier-jp5"].cpu.vendor == "NVIDIA"


def test_accelerator_names(profiles):
    names = {a.name for p in profiles.values() for a in p.accelerators}
    assert {
        "Intel NPU (Meteor Lake)",
        "NVIDIA Ampere GPU (ga10b)",
        "NVIDIA Maxwell GPU (gm20b)",
        "NVIDIA Volta GPU (gv11b)",
        "Hexagon cDSP (HTP)",
        "Apple Neural Engine",
    } <= names


@pytest.mark.parametrize("name", ["garbage", "empty"])
def test_garbage_and_empty_give_valid_json_with_nulls(name):
    prof = detect(NOT_DEVICES / name)
    d = json.loads(json.dumps(prof.to_dict()))
    assert d["arch"] is None and d["os"] is None and d["memory_bytes"] is None and d["board"] is None
    assert d["cpu"] == {"vendor": None, "model": None, "cores": None, "flags": []}
    assert d["accelerators"] == [] and d["throttling"] is None
    assert d["target"] in ("generic-aarch64", "generic-x86_64")
    assert any("arch unknown" in n for n in d["notes"])
    assert not any("internal error" in n for n in d["notes"])


def test_garbage_notes_name_the_files():
    notes = detect(NOT_DEVICES / "garbage").notes
    for rel in (
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/proc/device-tree/compatible",
        "/etc/os-release",
        "/etc/nv_tegra_release",
        "get_throttled",
        "/sys/class/accel/accel0/device/vendor",
    ):
        assert any(rel in n for n in notes), rel


def test_new_device_classes(profiles):
    """Names a user reads first: Lunar Lake NPU generation, the Coral TPU, Lenovo's marketing name, M3 flags."""
    names = {a.name for p in profiles.values() for a in p.accelerators}
    assert {
        "Intel NPU (Lunar Lake)",
        "Intel Arc 140V (Lunar Lake)",
        "Coral Edge TPU (PCIe)",
        "Apple M3 Max GPU",
    } <= names
    assert profiles["intel-lunarlake-npu"].board.vendor == "LENOVO"
    assert not any(f.startswith("avx512") for f in profiles["intel-lunarlake-npu"].cpu.flags)
    assert {"FEAT_BF16", "FEAT_I8MM"} <= set(profiles["apple-m3-max"].cpu.flags)
    assert "FEAT_SME" not in profiles["apple-m3-max"].cpu.flags
    assert profiles["ampere-altra-cax31"].board.vendor == "Hetzner"
    assert profiles["ampere-altra-cax31"].cpu.vendor == "ARM"
