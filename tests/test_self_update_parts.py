"""Parts of the self-update (issue 40) that need no running agent: prune keeps every release the guard may still
need (current, previous, the one asked for, the one on trial), and the guard's systemd unit and the agent's unit
pass `systemd-analyze verify` together (the trial flow under systemd, docs/self-update.md), and a release that
carries its dependencies can install the next one (its venv has pip)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent.release import install
from agent.release.install import INSTALLED, prune, releases
from agent_guard import links

REPO = Path(__file__).resolve().parents[1]


def _release(root: Path, version: str, complete: bool = True) -> None:
    (root / "releases" / version / "venv").mkdir(parents=True)
    if complete:
        (root / "releases" / version / INSTALLED).write_text(json.dumps({"version": version}))


def test_prune_never_removes_a_release_awaiting_or_on_trial(tmp_path):
    for version in ("1.0", "1.1", "1.2", "1.3", "1.4"):
        _release(tmp_path, version)
    _release(tmp_path, "1.5", complete=False)  # a power cut during its install
    links.set_link(tmp_path, links.CURRENT, "1.1")
    links.set_link(tmp_path, links.PREVIOUS, "1.0")
    links.write_json(tmp_path / "guard" / "request.json", {"version": "1.3"})  # `release activate 1.3`, not started
    assert sorted(prune(tmp_path, keep_extra=("1.4",))) == ["1.2", "1.5"]
    assert [r["version"] for r in releases(tmp_path)] == ["1.0", "1.1", "1.3", "1.4"]

    # the guard took the request: trial.json names it until the report is written
    (tmp_path / "guard" / "request.json").unlink()
    links.write_json(tmp_path / "guard" / "trial.json", {"version": "1.3", "from": "1.1", "step": "starting"})
    assert prune(tmp_path) == ["1.4"]
    (tmp_path / "guard" / "trial.json").unlink()
    assert prune(tmp_path) == ["1.3"]  # its trial over (a report written): only current and previous are kept
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["1.0", "1.1"]


def test_the_guard_unit_and_the_agent_unit_verify_together(tmp_path):
    exe = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not Path(exe).exists():
        pytest.skip("systemd-analyze is not installed here: the units are not verified")
    guard = (REPO / "systemd" / "edge-agent-guard.service").read_text()
    assert "--systemd edge-agent.service" in guard and "Before=edge-agent.service" in guard
    agent = (REPO / "systemd" / "edge-agent.service").read_text()
    assert "After=edge-agent-guard.service" in agent
    # as install.sh writes it: ExecStart names an executable that exists here (the release's is not installed)
    (tmp_path / "edge-agent.service").write_text(agent.replace("/opt/edge-agent/venv", str(Path(sys.prefix))))
    (tmp_path / "edge-agent-guard.service").write_text(guard)
    args = [exe, "verify", str(tmp_path / "edge-agent-guard.service"), str(tmp_path / "edge-agent.service")]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def _wheel(folder: Path, name: str, version: str) -> dict[str, str]:
    """A pure-Python wheel of one module, written by hand (a zip with its dist-info), as the manifest lists it."""
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join([*record, f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
    return {"name": name, "version": version, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_a_release_with_its_dependencies_can_install_the_next_one(tmp_path):
    """A self-contained release's venv must hold pip: the next release is installed with `python -m pip` of the
    running one (a venv made --without-pip, as every release was, could never update again)."""
    dest = tmp_path / "releases" / "2.0"
    (dest / "wheelhouse").mkdir(parents=True)
    doc = {"version": "2.0", "dependencies": "wheelhouse", "wheels": [_wheel(dest / "wheelhouse", "tinydep", "1.0")]}
    install._venv(dest, doc, None)
    python = str(dest / "venv" / "bin" / "python")
    got = subprocess.run([python, "-c", "import tinydep; print(tinydep.VERSION)"], capture_output=True, text=True)
    assert got.stdout.strip() == "1.0", got.stderr
    pip = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and "pip" in pip.stdout, pip.stderr
