"""`edge-agent providers`: the real CLI in a child process, on this host and on captured sysroots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirunner import edge_agent
from hostruntime import ort_openvino_devices
from support.files import write_tree as _sysroot

from agent import sysroots as captures
from agent.hardware import detect
from agent.providers import PROVIDER_NAMES
from agent.providers._common import has_bf16

ROOT = Path(__file__).resolve().parent.parent
SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
KEYS = {"name", "available", "reason", "remedy", "devices", "options", "versions"}

ORIN_NANO = {
    "etc/nv_tegra_release": b"# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
    b"DATE: Wed Jan  8 01:49:37 UTC 2025\n",
    "proc/device-tree/model": b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\0",
    "proc/device-tree/compatible": b"nvidia,p3768-0000+p3767-0005-super\0nvidia,p3767-0005\0nvidia,tegra234\0",
    "proc/cpuinfo": b"".join(
        b"processor\t: %d\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
        b"asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg\nCPU implementer\t: 0x41\n"
        b"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd42\nCPU revision\t: 1\n\n" % i
        for i in range(6)
    ),
    "proc/meminfo": b"MemTotal:        7802952 kB\nMemFree:         5012344 kB\n",
    "etc/os-release": b'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\nVERSION_ID="22.04"\n',
    "sys/class/devfreq/17000000.gpu/device/of_node/name": b"gpu\0",
}


def cli(*args: str):
    return edge_agent("providers", *args)


def test_json_on_this_host_lists_every_provider_with_cpu_and_openvino_available():
    res = cli("--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert sorted(r["name"] for r in rows) == sorted(PROVIDER_NAMES)
    assert all(KEYS <= set(r) for r in rows)
    by = {r["name"]: r for r in rows}
    assert by["cpu"]["available"] and by["openvino"]["available"]
    assert "CPU" in by["openvino"]["devices"]
    # available means a session opened here, on each device listed
    assert all(r["opened"] is True and "session opened on" in r["reason"] for r in rows if r["available"])
    assert not any(r["expected"] for r in rows)
    ov_ep = by["ort-openvino"]
    if ort_openvino_devices():  # the plugin enumerates a device here (an Intel host): it must be offered
        assert ov_ep["available"] and "CPU" in ov_ep["devices"], ov_ep
    else:
        assert not ov_ep["available"] and "Intel devices only" in ov_ep["reason"]
    assert all(r["remedy"] for r in rows if not r["available"])


def test_jetson_capture_puts_tensorrt_first_and_explains(tmp_path):
    root = _sysroot(tmp_path / "orin", ORIN_NANO)
    res = cli("--sysroot", str(root), "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    first = rows[0]
    assert first["name"] == "tensorrt" and not first["available"]
    import onnxruntime

    if "TensorrtExecutionProvider" in onnxruntime.get_available_providers():  # a GPU build here: expected only
        assert first["expected"] and first["reason"].startswith("expected, not opened here: ")
    else:
        assert first["reason"].startswith("TensorRT EP not in this onnxruntime build")
        assert "JetPack 6" in first["remedy"] and "Jetson AI Lab" in first["remedy"]
    cpu = next(r for r in rows if r["name"] == "cpu")  # the Orin's CPU: expected, never opened from this host
    assert cpu["expected"] and not cpu["available"] and cpu["reason"].startswith("expected, not opened here: ")
    assert not any(r["available"] for r in rows)


def test_human_table_has_a_reason_and_remedy_per_unavailable_provider(tmp_path):
    root = _sysroot(tmp_path / "orin", ORIN_NANO)
    res = cli("--sysroot", str(root))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.splitlines()[0].startswith("target: ")
    for name in PROVIDER_NAMES:
        assert f" {name} " in out
    rows = json.loads(cli("--sysroot", str(root), "--json").stdout)
    assert out.count("why: ") == sum(not r["available"] for r in rows)
    assert out.count("fix: ") == sum(not r["available"] for r in rows)
    assert out.count("expected, not opened here  ") == sum(r["expected"] for r in rows) > 0


@pytest.mark.parametrize(
    "files",
    [
        {},
        {
            "proc/cpuinfo": b"\x00\xff garbage",
            "proc/device-tree/compatible": b"\xff\xfe",
            "etc/nv_tegra_release": b"nonsense",
        },
    ],
)
def test_empty_and_garbage_sysroots_give_valid_json(tmp_path, files):
    root = _sysroot(tmp_path / "junk", files)
    root.mkdir(exist_ok=True)
    res = cli("--sysroot", str(root), "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert {r["name"] for r in rows} == set(PROVIDER_NAMES)
    assert next(r for r in rows if r["name"] == "cpu")["expected"]


def test_bad_arguments_are_one_line_errors(tmp_path):
    res = cli("--sysroot", str(tmp_path / "missing"))
    assert res.returncode != 0 and res.stderr.strip().splitlines() == [
        f"error: --sysroot {tmp_path / 'missing'}: no such directory or capture tarball"
    ]
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tarball")
    res = cli("--sysroot", str(tmp_path / "junk.tar.gz"))
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1 and "capture tarball" in res.stderr
    res = cli("--target", "no-such-target")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith("error:") and len(res.stderr.strip().splitlines()) == 1


def test_every_captured_sysroot_ranks_and_explains():
    captures = sorted(p for p in SYSROOTS.iterdir() if p.is_dir()) if SYSROOTS.is_dir() else []
    assert captures, f"no captures under {SYSROOTS}"
    from click.testing import CliRunner

    from agent.cli.providers import providers

    runner = CliRunner()
    for root in captures:  # in-process: the same command object, without a child per capture
        res = runner.invoke(providers, ["--sysroot", str(root), "--json"])
        assert res.exit_code == 0, f"{root.name}: {res.output} {res.exception!r}"
        rows = json.loads(res.output)
        assert {r["name"] for r in rows} >= set(PROVIDER_NAMES), root.name
        assert all(r["reason"] for r in rows), root.name


def test_verify_opens_real_sessions_on_the_available_providers():
    res = cli("--verify", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    for name in ("cpu", "openvino"):
        v = rows[name]["verified"]
        assert v["ok"] and v["coverage"] == 1.0 and v["device"] == "CPU", v
    # the precision OpenVINO really uses by default: bf16 on avx512_bf16/AMX CPUs (like this machine's), else f32
    assert rows["openvino"]["verified"]["precision"] == ("bf16" if has_bf16(detect("/")) else "f32")
    assert "verified" not in rows["tensorrt"]
    res = cli("--verify", "--sysroot", str(ROOT))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: --verify opens sessions on this host, so it cannot be combined with --sysroot"
    ]


def test_capture_tarball_and_new_device_classes_rank_as_their_targets(tmp_path):
    import tarfile

    from click.testing import CliRunner

    from agent.cli.providers import providers

    archive = tmp_path / "orin.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(SYSROOTS / "jetson-agx-orin-64gb-jp61", arcname=".")
    runner = CliRunner()
    rows = json.loads(runner.invoke(providers, ["--sysroot", str(archive), "--json"]).output)
    assert [r["name"] for r in rows[:4]] == ["tensorrt", "cuda", "openvino", "cpu"]
    assert "JetPack 6.1" in rows[0]["remedy"]
    rows = json.loads(runner.invoke(providers, ["--sysroot", str(SYSROOTS / "intel-lunarlake-npu"), "--json"]).output)
    assert rows[0]["name"] == "openvino" and rows[0]["devices"][0] == "NPU"
    # the capture's NPU and GPU: what that device would offer, never "available" from this host
    assert rows[0]["expected"] and not rows[0]["available"] and rows[0]["reason"].startswith("expected, not opened")
    for name, alt in (("apple-m3-max", "coreml"), ("qualcomm-qcs6490", "qnn"), ("rpi-cm4-coral", "use cpu")):
        rows = json.loads(runner.invoke(providers, ["--sysroot", str(SYSROOTS / name), "--json"]).output)
        trt = next(r for r in rows if r["name"] == "tensorrt")
        assert alt in trt["remedy"] and "openvino" not in trt["remedy"], (name, trt["remedy"])
