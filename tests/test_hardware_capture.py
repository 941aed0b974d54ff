"""scripts/capture-sysroot.sh: run it here, then profile the tarball it wrote; it must agree with the live profile."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

from agent import sysroots as captures
from agent.hardware import detect

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "capture-sysroot.sh"


def test_capture_round_trip(tmp_path):
    out = tmp_path / "cap.tar.gz"
    res = subprocess.run(["sh", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stderr
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert all(not m.issym() and not m.islnk() for m in tar.getmembers())
        tar.extractall(tmp_path / "root", filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(
            tmp_path / "root"
        )
    assert "./proc/cpuinfo" in names and "./.captures/info.txt" in names
    info = captures.provenance(tmp_path / "root")  # the same keys and rule the shipped captures hold
    assert info["tool"] == ["edge-agent capture-sysroot.sh 1"] and len(info["captured"]) == 1
    assert captures.provenance_problems(tmp_path / "root") == []  # the rule every shipped capture passes
    assert info["anonymised"] == captures.provenance(captures.path("rpi4-4gb"))["anonymised"]
    assert ("./.captures/vcgencmd.txt" in names) == bool(shutil.which("vcgencmd"))  # no empty placeholder files
    live, captured = detect("/"), detect(tmp_path / "root")
    for field in ("arch", "os", "memory_bytes", "soc", "accelerators", "target"):
        assert getattr(captured, field) == getattr(live, field), field
    assert captured.cpu.model == live.cpu.model and captured.cpu.flags == live.cpu.flags
    assert out.stat().st_size < 1 << 20
    shutil.rmtree(tmp_path / "root")
