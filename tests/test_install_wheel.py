"""A plain, non-editable install: the wheel built from this tree, installed into a fresh venv, runs
`edge-agent fleet simulate` on the device captures it ships (agent/sysroots as package data), with no source tree
and no network (dependencies come from the venv running the tests, added behind the new venv's own packages)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from agent import sysroots as captures

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "agent", "hwtests", "targets")


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(venv, env): edge-agent installed from a wheel into a new venv; env runs it without this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCES:  # build from a copy: the checkout stays free of build/ and egg-info
        p = ROOT / name
        (shutil.copytree(p, src / name, ignore=ignore) if p.is_dir() else shutil.copy2(p, src / name))
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        tmp / "dist",
        src,
        cwd=tmp,
    )
    (wheel,) = (tmp / "dist").glob("edge_agent-*.whl")
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    py = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", wheel, cwd=tmp)
    site = Path(run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp).strip())
    # the runtimes (onnxruntime, paho, ...) from the test venv, after the wheel's own packages; a path line in a
    # .pth does not run that directory's .pth files, so the checkout's editable hook stays out
    (site / "zz-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EDGE_AGENT_TARGETS_DIR", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env


def test_the_wheel_ships_every_capture_and_reads_them_from_its_own_files(installed, tmp_path):
    venv, env = installed
    code = "import json, agent, agent.sysroots as s; print(json.dumps([agent.__file__, str(s.root()), s.names()]))"
    agent_file, root, names = json.loads(run(venv / "bin" / "python", "-c", code, cwd=tmp_path, env=env))
    assert Path(agent_file).is_relative_to(venv) and Path(root).is_relative_to(venv)  # not this checkout
    assert names == captures.names()
    for name in names:  # every file of every capture, hidden .captures/ and empty device nodes included
        ours = sorted(p.relative_to(captures.path(name)) for p in captures.path(name).rglob("*") if p.is_file())
        theirs = sorted(p.relative_to(Path(root) / name) for p in (Path(root) / name).rglob("*") if p.is_file())
        assert theirs == ours, name


def test_fleet_simulate_runs_from_a_plain_pip_install(installed, mosquitto, tmp_path):
    from agent.artifacts.keys import generate

    venv, env = installed
    _, pub, _ = generate(tmp_path / "keys")
    cmd = [str(venv / "bin" / "edge-agent"), "fleet", "simulate", "--devices", "3", "--trust", str(pub)]
    cmd += ["--broker", mosquitto.url, "--state-dir", str(tmp_path / "fleet"), "--json"]
    err_path = tmp_path / "simulate.stderr"  # a file, not a pipe nobody reads: a full pipe would block its writes
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        started = json.loads(_line(proc, err_path, 180, "started") or "{}")
        assert started["event"] == "started" and started["devices"] == 3
        assert set(started["classes"]) <= set(captures.names()) and sum(started["classes"].values()) == 3
        proc.send_signal(signal.SIGTERM)
        stopped = json.loads(_line(proc, err_path, 180, "stopped after SIGTERM") or "{}")
        assert stopped["event"] == "stopped"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert len([p for p in (tmp_path / "fleet").iterdir() if (p / "status.json").is_file()]) == 3


def _line(proc: subprocess.Popen, err_path: Path, timeout: float, what: str) -> str:
    """The next stdout line within `timeout`; otherwise every thread's stack (SIGUSR1: the CLI's faulthandler)
    and the command's stderr in the failure."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if ready:
        line = proc.stdout.readline()
        if line:
            return line
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
    raise AssertionError(f"simulate: no '{what}' line in {timeout:.0f} s (exit {proc.poll()}):\n{err_path.read_text()}")
