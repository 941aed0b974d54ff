"""The per-concern readers: Pi revision and throttle decoding, L4T -> JetPack, cpuinfo, sysroot safety."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import sysroots as captures
from agent.hardware.cpu import read_cpu
from agent.hardware.devicetree import decode_pi_revision
from agent.hardware.jetson import read_l4t
from agent.hardware.macos import chip_name, parse_sysctl
from agent.hardware.sysroot import Sysroot, decode_clean
from agent.hardware.thermal import decode_throttled
from agent.targets import detect_device as detect  # detection plus the matched target

SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
NOT_DEVICES = Path(__file__).parent / "fixtures" / "sysroots"  # garbage, empty: test-only trees


def write(root: Path, rel: str, data: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.mark.parametrize(
    "code, model, soc, gib",
    [
        ("c03114", "Raspberry Pi 4B", "BCM2711", 4),
        ("d04170", "Raspberry Pi 5", "BCM2712", 8),
        ("c04170", "Raspberry Pi 5", "BCM2712", 4),
        ("e04171", "Raspberry Pi 5", "BCM2712", 16),
        ("a020d3", "Raspberry Pi 3B+", "BCM2837", 1),
        ("902120", "Raspberry Pi Zero 2 W", "BCM2837", 0.5),
        ("c03130", "Raspberry Pi 400", "BCM2711", 4),
        ("b03140", "Raspberry Pi CM4", "BCM2711", 2),
    ],
)
def test_pi_revision_codes(code, model, soc, gib):
    rev = decode_pi_revision(code)
    assert (rev.model, rev.soc, rev.memory_bytes) == (model, soc, int(gib * (1 << 30)))


@pytest.mark.parametrize("code", ["0002", "a02082x", "", "ffffff", "zz"])
def test_pi_revision_rejects_old_style_and_garbage(code):
    # old-style codes (bit 23 clear) and out-of-table fields are not guessed at
    assert decode_pi_revision(code) is None


def test_throttled_bits():
    d = decode_throttled("50005")
    assert d["raw"] == "0x50005"
    assert d["under_voltage"] and d["throttled"] and not d["freq_capped"]
    assert d["under_voltage_occurred"] and d["throttled_occurred"] and not d["soft_temp_limit_occurred"]
    assert decode_throttled("0")["raw"] == "0x0" and not any(v for k, v in decode_throttled("0").items() if k != "raw")
    assert decode_throttled("throttled=0x80008")["soft_temp_limit"] is True
    assert decode_throttled("hello") is None


@pytest.mark.parametrize(
    "line, l4t, jetpack",
    [
        ("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: x", "36.4.3", "6.2"),
        ("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: x", "35.4.1", "5.1.2"),
        ("# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, DATE: x", "32.7.1", "4.6.1"),
        ("# R36 (release), REVISION: 9.0, GCID: 1, BOARD: generic, EABI: aarch64, DATE: x", "36.9.0", "6.x"),
        ("# R38 (release), REVISION: 2.0, GCID: 1, BOARD: generic, EABI: aarch64, DATE: x", "38.2.0", "7.0"),
    ],
)
def test_l4t_to_jetpack(tmp_path, line, l4t, jetpack):
    write(tmp_path, "etc/nv_tegra_release", line + "\n")
    sr = Sysroot(tmp_path)
    assert read_l4t(sr)["l4t"] == l4t and read_l4t(sr)["jetpack"] == jetpack
    assert ("not in the JetPack table" in " ".join(sr.notes)) == jetpack.endswith(".x")


def test_nv_tegra_release_without_header_is_a_note(tmp_path):
    write(tmp_path, "etc/nv_tegra_release", "hello world\n")
    sr = Sysroot(tmp_path)
    assert read_l4t(sr) == {} and "L4T unknown" in sr.notes[0]


def test_armv7_cpuinfo_is_not_called_aarch64(tmp_path):
    write(
        tmp_path,
        "proc/cpuinfo",
        "processor\t: 0\nmodel name\t: ARMv7 Processor rev 4 (v7l)\n"
        "Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32\n"
        "CPU implementer\t: 0x41\nCPU architecture: 7\nCPU part\t: 0xd08\n",
    )
    sr = Sysroot(tmp_path)
    cpu, arch, _ = read_cpu(sr)
    assert arch is None and cpu.cores == 1 and cpu.model == "Cortex-A72"
    assert "armv7" in sr.notes[0]


def test_partial_capture_keeps_what_it_understood(tmp_path):
    shutil.copytree(SYSROOTS / "rpi5-8gb", tmp_path / "r")
    (tmp_path / "r/proc/meminfo").write_bytes(b"\xff\xfe garbage \x00")
    (tmp_path / "r/proc/device-tree/compatible").write_bytes(b"")
    prof = detect(tmp_path / "r")
    # memory falls back to the revision code; the board still comes from the model string and cpuinfo
    assert prof.memory_bytes == 8 << 30 and prof.target == "raspberry-pi-5" and prof.arch == "aarch64"
    assert any("/proc/meminfo" in n for n in prof.notes)
    assert any("revision code" in n for n in prof.notes)


def test_link_out_of_sysroot_is_not_followed(tmp_path):
    outside = tmp_path / "host-secret"
    write(outside, "cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu lm avx2\n")
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    os.symlink(outside / "cpuinfo", root / "proc" / "cpuinfo")
    prof = detect(root)
    assert prof.arch is None and prof.cpu.cores is None
    assert any("outside the sysroot" in n for n in prof.notes)


def test_fifo_and_directory_do_not_block_or_raise(tmp_path):
    (tmp_path / "proc").mkdir()
    os.mkfifo(tmp_path / "proc" / "cpuinfo")  # opening a FIFO for reading would block forever
    (tmp_path / "proc" / "meminfo").mkdir()
    prof = detect(tmp_path)
    assert prof.cpu.cores is None and prof.memory_bytes is None
    assert any("not a regular file" in n for n in prof.notes)


def test_sysroot_never_reads_the_host(monkeypatch):
    def forbidden(*_a, **_k):
        raise AssertionError("host was consulted")

    monkeypatch.setattr(platform, "machine", forbidden)
    monkeypatch.setattr(os, "cpu_count", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    for root in (NOT_DEVICES / "empty", NOT_DEVICES / "garbage", SYSROOTS / "apple-m2", SYSROOTS / "rpi4-4gb"):
        prof = detect(root, use_host_tools=True)
        assert not any("internal error" in n for n in prof.notes), prof.notes
    assert detect(NOT_DEVICES / "empty").cpu.cores is None


def test_rosetta_is_reported(tmp_path):
    shutil.copytree(SYSROOTS / "apple-m2", tmp_path / "m")
    cap = tmp_path / "m/.captures/sysctl.txt"
    cap.write_text(cap.read_text() + "\nsysctl.proc_translated: 1\n")  # what `sysctl -a` adds under Rosetta
    prof = detect(tmp_path / "m")
    assert prof.arch == "aarch64" and prof.software["rosetta"] is True and prof.target == "apple-silicon"
    assert any("Rosetta" in n for n in prof.notes)


def test_sysctl_parser_accepts_both_separators():
    assert parse_sysctl("hw.ncpu: 8\nkern.osproductversion = 15.1\njunk line\n") == {
        "hw.ncpu": "8",
        "kern.osproductversion": "15.1",
    }


def test_the_chip_is_the_brand_string_else_what_hw_cpufamily_names():
    """`sysctl hw` has no machdep.cpu.brand_string: hw.cpufamily, signed as sysctl prints it, names the chip."""
    assert chip_name({"machdep.cpu.brand_string": "Apple M2 Pro", "hw.cpufamily": "-634136515"}) == "Apple M2 Pro"
    assert chip_name({"hw.cpufamily": "-634136515"}) == chip_name({"hw.cpufamily": str(0xDA33D83D)})
    assert chip_name({"hw.cpufamily": "-634136515"}) == "Apple M2-series"
    assert chip_name({"hw.cpufamily": "305419896"}) == "Apple (hw.cpufamily 0x12345678)"  # unknown: said, not guessed
    assert chip_name({}) is None and chip_name({"hw.cpufamily": "x"}) is None


def test_decode_clean():
    assert decode_clean(b"Raspberry Pi 5 Model B Rev 1.0\x00") == "Raspberry Pi 5 Model B Rev 1.0"
    assert decode_clean(b"a\x00b") is None and decode_clean(b"\xff") is None


def test_not_a_directory_is_a_note(tmp_path):
    prof = detect(tmp_path / "missing")
    assert prof.arch is None and "not a directory" in prof.notes[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cpuinfo=st.binary(max_size=300),
    meminfo=st.binary(max_size=100),
    compat=st.binary(max_size=60),
    throttled=st.binary(max_size=12),
    temp=st.binary(max_size=12),
    sysctl=st.one_of(st.none(), st.binary(max_size=200)),
)
def test_arbitrary_bytes_never_raise(cpuinfo, meminfo, compat, throttled, temp, sysctl):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        write(root, "proc/cpuinfo", cpuinfo)
        write(root, "proc/meminfo", meminfo)
        write(root, "proc/device-tree/compatible", compat)
        write(root, "sys/devices/platform/soc/soc:firmware/get_throttled", throttled)
        write(root, "sys/class/thermal/thermal_zone0/temp", temp)
        if sysctl is not None:
            write(root, ".captures/sysctl.txt", sysctl)
        prof = detect(root)
        d = json.loads(json.dumps(prof.to_dict()))
        assert d["arch"] in (None, "x86_64", "aarch64") and d["target"]
        assert not any("internal error" in n for n in d["notes"]), d["notes"]


def test_hailo_on_pci_without_driver_is_explained(tmp_path):
    shutil.copytree(SYSROOTS / "rpi5-hailo8l", tmp_path / "r")
    (tmp_path / "r/dev/hailo0").unlink()
    prof = detect(tmp_path / "r")
    assert [(a.vendor, a.device) for a in prof.accelerators] == [("hailo", "pci:0001:01:00.0")]
    assert any("driver is not loaded" in n for n in prof.notes)


def test_npu_without_device_node_is_explained(tmp_path):
    shutil.copytree(SYSROOTS / "intel-nuc-meteorlake", tmp_path / "n")
    (tmp_path / "n/dev/accel/accel0").unlink()
    prof = detect(tmp_path / "n")
    assert prof.has_accelerator("npu", "intel") and any("no /dev/accel/accel0" in n for n in prof.notes)


def test_coral_usb_and_pcie(tmp_path):
    write(
        tmp_path,
        "proc/cpuinfo",
        "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd03\n",
    )
    write(tmp_path, "sys/bus/usb/devices/2-1/idVendor", "18d1\n")
    write(tmp_path, "sys/bus/usb/devices/2-1/idProduct", "9302\n")
    write(tmp_path, "dev/apex_0", b"")
    prof = detect(tmp_path)
    assert prof.arch == "aarch64" and prof.cpu.model == "Cortex-A53" and prof.target == "generic-aarch64"
    assert sorted(a.device for a in prof.accelerators if a.vendor == "google") == ["/dev/apex_0", "usb:18d1:9302"]
