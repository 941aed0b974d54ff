"""`edge-agent profile`: JSON, human summary, one-line errors; `edge-agent --help` lists it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clirunner import edge_agent as run_cli

from agent import sysroots as captures

SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
NOT_DEVICES = Path(__file__).parent / "fixtures" / "sysroots"  # garbage, empty: test-only trees


def test_profile_json_on_a_sysroot():
    res = run_cli("profile", "--sysroot", str(SYSROOTS / "jetson-orin-nano-jp6"), "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["arch"] == "aarch64" and d["target"] == "jetson-orin"
    assert d["software"]["jetpack"] == "6.2" and d["accelerators"][0]["vendor"] == "nvidia"


def test_profile_takes_the_name_of_a_shipped_capture(tmp_path):
    res = run_cli("profile", "--sysroot", "rpi4-4gb", "--json", cwd=tmp_path)  # no such path here: the package's
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["board"]["model"] == "Raspberry Pi 4 Model B Rev 1.1" and d["target"] == "raspberry-pi-4"


def test_profile_human_summary():
    from click.testing import CliRunner

    from agent.cli.profile import profile

    out = CliRunner().invoke(profile, ["--sysroot", str(SYSROOTS / "rpi5-hailo8l")])
    assert out.exit_code == 0, out.output
    lines = {line.split()[0]: line for line in out.output.splitlines() if line and not line.startswith(" ")}
    assert "Raspberry Pi 5 Model B Rev 1.0" in lines["board"]
    assert "3.9 GiB" in lines["memory"] and "BCM2712" in lines["soc"] and "4 logical CPUs" in lines["cpu"]
    assert "npu hailo: Hailo-8/8L [/dev/hailo0]" in lines["accelerators"]
    assert "soft_temp_limit" in lines["throttling"] and "0x80008" in lines["throttling"]
    assert "raspberry-pi-5" in lines["target"]
    assert {"neon", "fp16", "dotprod", "hailo-npu", "npu"} <= set(lines["features"].split()[1:])


def test_profile_garbage_lists_notes():
    from click.testing import CliRunner

    from agent.cli.profile import profile

    out = CliRunner().invoke(profile, ["--sysroot", str(NOT_DEVICES / "garbage")])
    assert out.exit_code == 0
    assert re.search(r"^arch +unknown$", out.output, re.M) and "- /proc/cpuinfo: not understood" in out.output


def test_profile_this_machine_json():
    res = run_cli("profile", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["arch"] in ("x86_64", "aarch64") and d["cpu"]["cores"] >= 1 and d["target"]


def test_missing_sysroot_is_one_line_error(tmp_path):
    res = run_cli("profile", "--sysroot", str(tmp_path / "nope"))
    assert res.returncode != 0 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        f"error: --sysroot {tmp_path / 'nope'}: no such directory or capture tarball"
    ]


def test_broken_targets_dir_is_reported_not_raised(tmp_path):
    (tmp_path / "x.yaml").write_text("name: y\n")
    res = run_cli(
        "profile", "--sysroot", str(SYSROOTS / "rpi4-4gb"), "--json", env={"EDGE_AGENT_TARGETS_DIR": str(tmp_path)}
    )
    d = json.loads(res.stdout)
    assert res.returncode == 0 and d["target"] is None and any("x.yaml: name:" in n for n in d["notes"])


def test_top_level_help_lists_profile():
    res = run_cli("--help")
    assert res.returncode == 0 and "profile" in res.stdout and "hardware profile" in res.stdout
    res = run_cli("profile", "--help")
    assert "--sysroot DIR" in res.stdout and "--json" in res.stdout


def test_profile_reads_a_capture_tarball(tmp_path):
    import tarfile

    archive = tmp_path / "pi.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(SYSROOTS / "rpi4-4gb", arcname=".")
    res = run_cli("profile", "--sysroot", str(archive), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["target"] == "raspberry-pi-4"
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tarball")
    res = run_cli("profile", "--sysroot", str(tmp_path / "junk.tar.gz"))
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1 and "capture tarball" in res.stderr


def test_help_of_profile_providers_and_config_gives_examples():
    for args in (["profile", "--help"], ["providers", "--help"], ["config", "--help"], ["config", "check", "--help"]):
        res = run_cli(*args)
        assert (
            res.returncode == 0 and "Examples:" in res.stdout and "edge-agent " in res.stdout.split("Examples:")[1]
        ), args


def test_unseen_captures_profile_through_the_cli():
    """Devices added in the quality pass, read the way a user does: arch, board, cores, accelerators, target."""
    want = {
        "jetson-agx-orin-64gb-jp61": (
            "aarch64",
            "NVIDIA Jetson AGX Orin Developer Kit",
            12,
            {"gpu", "npu"},
            "jetson-orin",
        ),
        "intel-lunarlake-npu": ("x86_64", "ThinkPad X1 Carbon Gen 13", 8, {"gpu", "npu"}, "intel-x86_64"),
        "rpi-cm4-coral": ("aarch64", "Raspberry Pi Compute Module 4 Rev 1.1", 4, {"tpu"}, "raspberry-pi-4"),
        "apple-m3-max": ("aarch64", "J516c", 16, {"gpu", "npu"}, "apple-silicon"),  # `sysctl hw`: hw.targettype
        "ampere-altra-cax31": ("aarch64", "vServer", 8, set(), "generic-aarch64"),
    }
    from click.testing import CliRunner

    from agent.cli.profile import profile

    for name, (arch, board, cores, kinds, target) in want.items():
        out = CliRunner().invoke(profile, ["--sysroot", str(SYSROOTS / name), "--json"])
        assert out.exit_code == 0, out.output
        d = json.loads(out.output)
        got = (d["arch"], d["board"]["model"], d["cpu"]["cores"], {a["kind"] for a in d["accelerators"]}, d["target"])
        assert got == (arch, board, cores, kinds, target), name
        assert d["notes"] == [], name
