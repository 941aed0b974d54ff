"""Helpers for the daemon tests: config files, packages dropped into the inbox, a daemon subprocess, HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from support.sdlisten import NotifyListener
from support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]  # the repository root (tests/support/daemon.py)
EXE = [sys.executable, "-m", "agent"]
FAST_ENV = {
    "EDGE_AGENT_PROBATION_S": "0.5",
    "EDGE_AGENT_QUALIFY_PROVIDERS": "cpu",
    "EDGE_AGENT_QUALIFY_BUDGET_S": "0.1",
    "EDGE_AGENT_QUALIFY_ISOLATE": "0",
}


def write_config(directory: Path, *, mqtt: dict | None = None, extra: dict | None = None) -> Path:
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    cfg = {
        "device_id": "dev-1",
        "state_dir": str(directory / "state"),
        "target": "generic-x86_64",
        # a 1 s shadow phase: it compares live traffic for up to duration_s (default 30 s), and most daemon tests
        # send none while a version deploys, so the phase ends `inconclusive` after 1 s instead of 30 and the
        # deployment goes on; the shadow's own tests set their phase (an `extra` serving block replaces this one)
        "serving": {"host": "127.0.0.1", "port": 0, "shadow": {"duration_s": 1.0}},
        "telemetry": {"interval_s": 0},
    }
    if mqtt:
        cfg["mqtt"] = mqtt
    cfg.update(extra or {})
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def drop(state_dir: Path, version: str, *, name: str = "tiny", writer=None) -> Path:
    """Write a package beside the inbox, then rename it into inbox/<name>/<version>/ (the documented contract)."""
    from agent.samples import sample_tiny_package

    inbox = state_dir / "inbox"
    tmp = inbox / f".tmp-{name}-{version}"
    (writer or (lambda d: sample_tiny_package(d, name=name, version=version)))(tmp)
    (inbox / name).mkdir(parents=True, exist_ok=True)
    os.rename(tmp, inbox / name / version)
    return inbox / name / version


class Daemon:
    """`edge-agent run --config FILE` as a subprocess; stderr goes to a log file. It runs under a test-bound
    NOTIFY_SOCKET (support.sdlisten): waiting for it to serve is waiting for its READY=1."""

    def __init__(self, config: Path, state_dir: Path, env: dict | None = None):
        self.config, self.state_dir = config, state_dir
        self.log = config.parent / "daemon.log"
        self.notify = NotifyListener()
        full = {**os.environ, **FAST_ENV, "NOTIFY_SOCKET": self.notify.path, **(env or {})}
        full.pop("WATCHDOG_USEC", None)
        full.pop("WATCHDOG_PID", None)
        if "EDGE_AGENT_TEST_CRASH_AT" not in (env or {}):
            full.pop("EDGE_AGENT_TEST_CRASH_AT", None)  # never inherit the crash hook
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                EXE + ["run", "--config", str(config)], cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT
            )

    def status(self) -> dict | None:
        try:
            doc = json.loads((self.state_dir / "status.json").read_bytes())
        except (OSError, ValueError):
            return None
        return doc if doc.get("pid") == self.proc.pid else None

    def wait_ready(self) -> dict:
        """Its status document once it serves: READY=1, within the start-up time the daemon asks systemd for
        (EXTEND_TIMEOUT_USEC), failing at once when it exits; it wrote status.json before READY."""
        self.notify.wait_ready(self.proc, self.log)
        return wait_for(self.status, 30.0, "daemon status.json after READY=1", self.proc)

    @property
    def url(self) -> str:
        """The inference URL, once the daemon is ready (before READY=1 it may still restore its models)."""
        return (self.wait_ready().get("serving") or {})["url"]

    def wait_deployment(self, version: str, *, terminal: bool = True, timeout: float = 120.0) -> dict:
        def done():
            doc = self.status() or {}
            dep = (doc.get("deployments") or {}).get("tiny") or {}
            ok = dep.get("version") == version and (dep.get("result") is not None or not terminal)
            return dep if ok and not doc.get("in_flight") else None

        return wait_for(done, timeout, f"deployment of version {version}", self.proc)

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.notify.close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def serving_package(directory: Path, package: Path, name: str, env: dict | None = None) -> Iterator[Daemon]:
    """A daemon on a config in `directory` (its state in directory/state), the package directory `package` dropped
    into its inbox as `name` version 1; yielded once that deployment committed. At exit it must stop cleanly."""
    d = Daemon(write_config(directory), directory / "state", env=env)
    try:
        d.wait_ready()
        drop(d.state_dir, "1", name=name, writer=lambda dst: shutil.copytree(package, dst))
        done = lambda: ((d.status() or {}).get("deployments") or {}).get(name, {}).get("result")  # noqa: E731
        assert wait_for(done, 240, f"{name} committed", d.proc) == "committed", d.tail()
        yield d
    finally:
        assert d.terminate() == 0, d.tail()


def infer(url: str, value: float = 0.0, model: str = "tiny", token: str | None = None) -> tuple[str, list[float]]:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [value] * 4}]}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw, head_len = resp.read(), resp.headers.get("Inference-Header-Content-Length")
    if head_len is None:
        doc = json.loads(raw)
        return doc["model_version"], doc["outputs"][0]["data"]
    # non-finite values have no JSON form: the server sends such an output as binary data (docs/serving.md)
    doc = json.loads(raw[: int(head_len)])
    out = doc["outputs"][0]
    assert out["datatype"] == "FP32", out
    data = np.frombuffer(raw[int(head_len) : int(head_len) + out["parameters"]["binary_data_size"]], "<f4")
    return doc["model_version"], data.tolist()


# ---- in-process DeviceAgent helpers -------------------------------------------------------------------


def fast(probation_s: float = 0.3):
    from agent.lifecycle.steps import StepConfig

    return StepConfig(
        probation_s=probation_s, providers=["cpu"], qualify_options={"latency_budget_s": 0.1, "isolate": False}
    )


def running_agent(tmp_path):
    """Body of the `agent` fixtures: an in-process DeviceAgent with fast knobs; collects its events."""

    from support.agent import make_agent

    events: list[dict] = []
    a = make_agent(tmp_path, on_event=events.append)
    a.events = events
    a.start()
    yield a
    a.stop()


def deploy(agent, version: str, writer=None, name: str = "tiny"):
    """Drop a package and wait for its deployment to end; returns the journal record."""
    drop(agent.state_dir, version, name=name, writer=writer)

    def ended():
        done = [d for d in agent.orchestrator.journal.all() if d.model == name and d.version == version]
        return done[-1] if done and done[-1].terminal else None

    try:
        return wait_for(ended, 120, f"{name} {version}")
    except AssertionError as e:  # say where it stood: a hang is then diagnosable from CI's output alone
        seen = [d for d in agent.orchestrator.journal.all() if d.model == name and d.version == version]
        where = f"{seen[-1].state.value}: {seen[-1].reason}" if seen else "never journaled (not picked up)"
        threads = sorted(t.name for t in threading.enumerate())
        raise AssertionError(f"{e}; the deployment stood at {where}; threads {threads}") from None


# the daemon killed with this state journaled -> (version serving after the restart, the deployment's end state)
RESTART_OUTCOME = {
    "received": ("2", "committed"),
    "downloading": ("2", "committed"),
    "verifying": ("2", "committed"),
    "qualifying": ("2", "committed"),
    "activating": ("1", "rolled_back"),
    "probation": ("1", "rolled_back"),
    "committed": ("2", "committed"),
}


def fleet_server(store: Path, broker_url: str) -> subprocess.Popen:
    """`edge-agent fleet serve` on `store` (a directory) and the broker, output discarded; terminate() it."""
    return subprocess.Popen(
        EXE + ["fleet", "serve", "--store", str(store), "--broker", broker_url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
