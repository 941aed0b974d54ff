"""The agent updates itself (issue 40) in a root-directory install, with edge-agent-guard as the test supervisor
standing in for systemd: real releases (a wheelhouse built from this source, the others derived from it by a small
patch and signed by a fleet key: agent.release.derive), real venvs, a real daemon serving a committed model and
connected to a real Mosquitto. A good release is trialled and kept; a release that crashes at import, hangs before
READY=1, cannot reach its broker or serves a wrong answer is rolled back to N with the reason, and N serves again;
a corrupted wheel is refused before anything installs; a power cut (kill -9 of the guard and the agent) at each
step of the swap leaves N serving. The guard runs with short limits (READY=1 within 10 s, the broker within 3 s
of it, SIGKILL 3 s after SIGTERM to a failed release)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from brokers import Mosquitto
from support.daemon import FAST_ENV, drop, infer, write_config

from agent_guard import broker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
GUARD = [sys.executable, str(REPO / "scripts" / "edge-agent-guard")]
N = "1.0.0"
FAULTS = {  # version -> (file, text, replacement): the fault a release carries
    "1.1.0": None,  # good
    "1.2.0": ("agent/__init__.py", "", 'raise ImportError("injected: this release cannot import")\n'),
    "1.3.0": (
        "agent/sdnotify.py",
        '        """READY=1 (once serving). Also sends MAINPID so `systemctl` tracks the right process."""\n',
        '        """READY=1 (once serving)."""\n        time.sleep(3600)  # injected: hangs before READY\n',
    ),
    "1.4.0": (
        "agent/serving/registry.py",
        "        with self.hold(name, version) as run:\n            want = run.check(feeds, outputs)",
        "        feeds = {k: v + 1 for k, v in feeds.items()}  # injected: a wrong answer\n"
        "        with self.hold(name, version) as run:\n            want = run.check(feeds, outputs)",
    ),
    "1.5.0": (
        "agent/transport/device.py",
        "        self._mqtt = MqttLink(\n            broker,",
        '        self._mqtt = MqttLink(\n            BrokerConfig("mqtt://127.0.0.1:1"),  # injected: a dead port',
    ),
}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, cwd=REPO)
    assert not check or r.returncode == 0, (args, r.stdout, r.stderr)
    return r


@pytest.fixture(scope="session")
def wheelhouses(tmp_path_factory):
    """{version: wheelhouse}: N built by `release build --no-deps` from a copy of this source, every release in
    FAULTS derived from it (agent.release.derive: its wheel patched, the manifest signed again by the fleet key)."""
    from agent.artifacts.keys import load_private_key
    from agent.release.derive import derive, replace_text

    base = tmp_path_factory.mktemp("releases")
    cli("keys", "generate", "--out", str(base / "keys"))
    src = base / f"src-{N}"
    for part in ("agent", "agent_guard", "hwtests", "targets"):
        shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "README.md", src / "README.md")
    text = (REPO / "pyproject.toml").read_text()
    (src / "pyproject.toml").write_text(text.replace('version = "0.1.0"', f'version = "{N}"', 1))
    out = {N: base / f"wheelhouse-{N}", "pub": base / "keys" / "fleet.pub"}
    cli("release", "build", "--src", str(src), "--out", str(out[N]), "--key", str(base / "keys/fleet.key"),
        "--no-deps")  # fmt: skip
    key = load_private_key(base / "keys" / "fleet.key")
    for version, fault in FAULTS.items():
        patches = (replace_text(*fault),) if fault else ()
        out[version] = derive(out[N], base / f"wheelhouse-{version}", version, key, patches)
    return out


class Device:
    def __init__(self, tmp: Path, wheelhouses: dict, mqtt: str | None = None):
        """mqtt: the broker's URL (models still come through the inbox, named in the config), else inbox mode."""
        self.root, self.wh = tmp / "opt", wheelhouses
        self.state = tmp / "etc" / "state"
        extra = {"inbox": str(self.state / "inbox")} if mqtt else None
        self.conf = write_config(tmp / "etc", mqtt={"url": mqtt} if mqtt else None, extra=extra)
        self.guard: subprocess.Popen | None = None
        self.install(N)

    def install(self, version: str) -> dict:
        r = cli("release", "install", str(self.wh[version]), "--root", str(self.root), "--trust", str(self.wh["pub"]),
                "--base-venv", str(Path(sys.executable).parents[1]), "--json")  # fmt: skip
        return json.loads(r.stdout)

    def start_guard(
        self, crash_at: str | None = None, max_tries: int = 2, ready_s: float = 10, broker_s: float = 3
    ) -> None:
        env = {**os.environ, **FAST_ENV}
        env.pop("EDGE_AGENT_GUARD_CRASH_AT", None)
        if crash_at:
            env["EDGE_AGENT_GUARD_CRASH_AT"] = crash_at
        # short limits (the agent is READY about 1 s after its start here): the hung release costs 10 s, not 120,
        # and a release ignoring SIGTERM is killed after 3 s
        args = ["supervise", "--root", str(self.root), "--config", str(self.conf), "--state-dir", str(self.state),
                "--ready-timeout", str(ready_s), "--stability", "3", "--deadline", "60", "--max-tries", str(max_tries),
                "--broker-timeout", str(broker_s),
                "--stop-timeout", "30", "--failed-stop-timeout", "3", "--restart-delay", "1"]  # fmt: skip
        log = open(self.root / "guard.log", "ab")  # noqa: SIM115
        self.guard = subprocess.Popen(
            GUARD + args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop_guard(self) -> None:
        if self.guard and self.guard.poll() is None:
            self.guard.send_signal(signal.SIGTERM)
            self.guard.wait(90)

    def serves(self, version: str = "1", timeout: float = 180) -> str:
        """The agent answers the committed model (model version `version`); returns the release it runs."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            status = _json(self.state / "status.json")
            url = (status.get("serving") or {}).get("url")
            try:
                if url and infer(url)[0] == version:
                    return os.readlink(self.root / "current")
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"model version {version} not served: {self.logs()}")

    def activate(self, version: str) -> subprocess.CompletedProcess:
        return cli("release", "activate", version, "--root", str(self.root), "--config", str(self.conf), "--json",
                   check=False)  # fmt: skip

    def report(self, version: str, count: int = 1, timeout: float = 400) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [_json(p) for p in sorted((self.root / "guard" / "reports").glob(f"*-{version}.json"))]
            if len(found) >= count:
                return found[count - 1]
            assert self.guard is None or self.guard.poll() is None, self.logs()
            time.sleep(0.3)
        raise AssertionError(f"no report {count} for {version}: {self.logs()}")

    def logs(self) -> str:
        parts = [self.root / "guard.log", self.root / "guard" / "agent.log"]
        return "\n".join(p.read_text(errors="replace")[-2500:] for p in parts if p.exists())


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def serving_device(tmp_path: Path, wheelhouses: dict, mqtt: str | None = None, **guard) -> Device:
    dev = Device(tmp_path, wheelhouses, mqtt)
    dev.start_guard(**guard)
    drop(dev.state, "1")
    dev.serves("1")
    return dev


@pytest.fixture
def device(tmp_path, wheelhouses):
    with Mosquitto(tmp_path / "mosquitto") as mosquitto:
        dev = serving_device(tmp_path, wheelhouses, mqtt=mosquitto.url, max_tries=1)
        yield dev
        dev.stop_guard()


@pytest.mark.system
def test_faulty_releases_roll_back_to_n_and_a_good_one_is_kept(device, wheelhouses):
    # a corrupted wheel: refused before anything installs
    bad = device.root.parent / "corrupt"
    shutil.copytree(wheelhouses["1.1.0"], bad)
    whl = next(bad.glob("*.whl"))
    data = bytearray(whl.read_bytes())
    data[len(data) // 2] ^= 0xFF
    whl.write_bytes(bytes(data))
    r = cli("release", "verify", str(bad), "--trust", str(wheelhouses["pub"]), check=False)
    assert r.returncode != 0 and "digest" in r.stderr, (r.stdout, r.stderr)
    r = cli("release", "install", str(bad), "--root", str(device.root), "--trust", str(wheelhouses["pub"]),
            "--base-venv", str(Path(sys.executable).parents[1]), check=False)  # fmt: skip
    assert r.returncode != 0 and not (device.root / "releases" / "1.1.0").exists(), r.stderr

    reasons = {
        "1.2.0": "before READY=1",  # crash at import
        "1.3.0": "no READY=1 within",  # hang before READY
        "1.5.0": "cannot reach the broker: not connected to its broker 3 s after READY=1",  # a dead port
        "1.4.0": "wrong answer: model tiny",  # serves a wrong answer for a committed model
    }
    for version, why in reasons.items():
        device.install(version)
        # --max-tries 1: each failed try marks its release bad here (the power-cut test: not before the limit)
        r = device.activate(version)
        assert r.returncode == 0 and json.loads(r.stdout)["golden_models"] == ["tiny"], r.stderr
        rep = device.report(version)
        assert rep["result"] == "rolled-back" and why in rep["reason"], rep
        assert rep["current"] == N and rep["previous_ready"] is True and rep["marked_bad"] is True, rep
        assert device.serves("1").endswith(N)
        if version == "1.2.0":  # a release marked bad is refused after
            assert device.activate("1.2.0").returncode != 0
            listed = {r["version"]: r for r in json.loads(cli("release", "list", "--root", str(device.root),
                                                                "--json").stdout)}  # fmt: skip
            assert listed["1.2.0"]["bad"] and listed[N]["current"], listed

    # the good release: trialled, kept, the model still serves with its state intact
    device.install("1.1.0")
    assert device.activate("1.1.0").returncode == 0
    rep = device.report("1.1.0")
    assert rep["result"] == "good" and rep["current"] == "1.1.0", rep
    assert rep["broker"].startswith("connected ") and rep["broker"].endswith(" s after READY=1"), rep
    assert device.serves("1").endswith("1.1.0")
    assert _json(device.state / "status.json")["broker"] == {"connected": True}
    links = json.loads(subprocess.run(GUARD + ["status", "--root", str(device.root), "--json"],
                                      capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert (links["current"], links["previous"]) == ("1.1.0", N), links
    listed = {r["version"]: r for r in json.loads(cli("release", "list", "--root", str(device.root), "--json").stdout)}
    assert len(listed) <= 3 and "1.2.0" not in listed, listed  # current, previous and the one installed last


@pytest.mark.system
def test_a_power_cut_at_each_step_of_the_swap_leaves_n_serving(tmp_path, wheelhouses):
    """One device cut at each step in turn: each restart of the guard recovers the cut before (a failed try of
    1.1.0 with its step as the reason, N serving) and carries the hook for the next step."""
    steps = ["stopping", "flipping", "starting", "ready"]
    device = serving_device(tmp_path, wheelhouses, crash_at=steps[0], max_tries=5)
    try:
        device.install("1.1.0")
        for count, step in enumerate(steps, 1):
            assert device.activate("1.1.0").returncode == 0, step
            assert device.guard is not None and device.guard.wait(300) == -signal.SIGKILL, (step, device.logs())
            following = steps[count] if count < len(steps) else None
            device.start_guard(crash_at=following, max_tries=5)  # the machine is back: recovery, then the agent
            rep = device.report("1.1.0", count=count)
            assert rep["result"] == "rolled-back" and f"interrupted at step {step}" in rep["reason"], (step, rep)
            assert not rep.get("marked_bad"), (step, rep)
            assert device.serves("1").endswith(N), step
        # no mqtt section: the broker check is not applicable, and the agent's status says why
        status = _json(device.state / "status.json")
        assert "broker" not in status and broker.state(device.state, status["pid"]) == (
            broker.NOT_APPLICABLE, "not applicable: no broker configured (inbox mode)")  # fmt: skip
    finally:
        device.stop_guard()
