"""`edge-agent keys|fleet push|serve|status` end to end: real broker, real CLI processes, and small devices
built from the real device-side pieces (DeviceLink, receive, ChunkPuller, ContentStore)."""

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clirunner import edge_agent as run_cli

from agent.artifacts import keys
from agent.artifacts.manifest import ManifestRejected, receive, rejection_record
from agent.artifacts.pull import ChunkPuller
from agent.artifacts.store import ContentStore
from agent.samples import sample_tiny_package
from agent.transport.device import DeviceLink, RawDesired

CLI = [sys.executable, "-m", "agent"]


class MiniDevice(threading.Thread):
    """Verify -> pull -> 'commit' -> retained status, as the daemon does (without qualification/serving)."""

    def __init__(self, url, device_id, groups, trusted, state_dir):
        super().__init__(daemon=True)
        # signed with its own key, registered with the control plane (fleet fixture): its reports count
        self.link = DeviceLink(url, device_id, groups=groups, signer=keys.device_key(state_dir))
        self.trusted, self.store, self.state_dir = trusted, ContentStore(state_dir), Path(state_dir)
        self.models, self.deployments = {}, {}
        self.stopping = threading.Event()

    def run(self):
        self.link.start()
        self.link.publish_status({"models": {}, "deployments": {}})
        while not self.stopping.is_set():
            try:
                ev = self.link.events.get(timeout=0.2)
            except queue.Empty:
                continue
            if isinstance(ev, RawDesired) and ev.payload:
                self.apply(ev)

    def apply(self, ev):
        installed = self.models.get(ev.model, {}).get("version")
        try:
            m = receive(ev.payload, self.trusted, installed, device_id=self.link.device_id, groups=self.link.groups)
        except ManifestRejected as exc:
            self.deployments[ev.model] = rejection_record(exc)
            self.link.publish_event(
                {"model": ev.model, "version": exc.version, "state": "rejected", "reason": exc.reason}
            )
        else:
            ChunkPuller(self.link, self.store, stall_timeout=60).pull(m)
            self.models[m.name] = {
                "version": m.version,
                "sha256": m.artifact.sha256,
                "provider": "cpu",
                "state": "committed",
            }
            self.deployments[m.name] = {
                "id": f"{m.name}-{m.version}",
                "version": m.version,
                "state": "committed",
                "result": "committed",
                "reason": "",
                "ts": time.time(),
            }
        self.link.publish_status({"models": self.models, "deployments": self.deployments})

    def stop(self):
        self.stopping.set()
        self.join(10)
        self.link.stop()


@pytest.fixture
def fleet(mosquitto, tmp_path):
    kdir = tmp_path / "keys"
    out = run_cli("keys", "generate", "--out", kdir)
    assert out.returncode == 0, out.stderr
    assert (kdir / "fleet.key").stat().st_mode & 0o777 == 0o600
    _, pub2, _ = keys.generate(tmp_path / "other")
    store = tmp_path / "cp-store"
    serve = subprocess.Popen(
        CLI + ["fleet", "serve", "--store", str(store), "--broker", mosquitto.url], stderr=subprocess.PIPE, text=True
    )
    assert "serving" in serve.stderr.readline()
    good = MiniDevice(mosquitto.url, "pi-1", ["lab"], keys.trusted_keys([kdir / "fleet.pub"]), tmp_path / "d1")
    stranger = MiniDevice(mosquitto.url, "pi-2", ["lab"], keys.trusted_keys([pub2]), tmp_path / "d2")
    for dev in (good, stranger):
        out = run_cli(
            "fleet",
            "register",
            dev.link.device_id,
            "--public-key",
            dev.state_dir / "device.pub",
            "--group",
            "lab",
            "--store",
            store,
        )
        assert out.returncode == 0, out.stderr
        dev.start()
    yield {"broker": mosquitto.url, "key": kdir / "fleet.key", "store": store, "tmp": tmp_path}
    good.stop()
    stranger.stop()
    serve.terminate()
    serve.wait(20)


def push(fleet, source, name, version, *args):
    """`fleet push SOURCE --name NAME --version VERSION ARGS...` signed with the fleet's key to its store and broker."""
    how = ["--key", fleet["key"], "--store", fleet["store"], "--broker", fleet["broker"]]
    return run_cli("fleet", "push", source, "--name", name, "--version", version, *args, *how)


def test_push_wait_succeeds_and_status_shows_the_model(fleet):
    pkg = sample_tiny_package(fleet["tmp"] / "tiny", version="2")
    out = push(fleet, pkg, "tiny", "2", "--device", "pi-1", "--wait", 90, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["devices"]["pi-1"]["result"] == "committed" and doc["format"] == "tar.gz"
    assert ContentStore(fleet["store"]).has(doc["sha256"])
    status = json.loads(
        run_cli("fleet", "status", "--broker", fleet["broker"], "--store", fleet["store"], "--json").stdout
    )
    rows = {r["device_id"]: r for r in status["devices"]}
    assert rows["pi-1"]["online"] and rows["pi-1"]["models"]["tiny"]["version"] == "2"
    assert rows["pi-1"]["models"]["tiny"]["state"] == "committed"
    # versions are monotonic: pushing an older one without --rollback is refused before publishing
    older = push(fleet, pkg, "tiny", "1", "--device", "pi-1")
    assert older.returncode != 0 and "use --rollback" in older.stderr and "Traceback" not in older.stderr


def test_group_push_reports_each_devices_rejection(fleet):
    onnx = fleet["tmp"] / "model.onnx"
    pkg = sample_tiny_package(fleet["tmp"] / "tiny3", version="3")
    onnx.write_bytes((pkg / "model.onnx").read_bytes())
    out = push(fleet, onnx, "tiny", "3", "--group", "lab", "--wait", 90)
    assert out.returncode != 0
    assert "pi-2: rejected" in out.stderr and "does not trust" in out.stderr and "Traceback" not in out.stderr
    assert "pi-1: committed" in out.stdout
    table = run_cli("fleet", "status", "--broker", fleet["broker"], "--store", fleet["store"])
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("pi-2"))
    assert "rejected" in line and "does not trust" in line


def test_bad_input_is_one_clear_line(fleet, tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    for args in (["--device", "../x"], ["--device", "pi-1", "--group", "lab"], []):
        out = push(fleet, bad, "m", "1", *args)
        assert out.returncode != 0 and out.stderr.strip().startswith("error:"), out.stderr
    out = push(fleet, bad, "m", "1", "--device", "pi-1")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode != 0 and last.startswith("error:") and "not a valid ONNX model" in last
    assert "Traceback" not in out.stderr
    assert not list(Path(fleet["store"], "blobs", "sha256").glob("*"))  # a broken model is never stored


def test_wrong_prefix_is_named_and_the_retained_state_cleared(fleet, tmp_path):
    """Issue 28, 6: a push --wait that hears no device on its prefix says where devices do report; `fleet clear`
    removes the desired state it left retained; a context file fills --broker/--store/--key/--prefix."""
    ctx = tmp_path / "fleet.yaml"
    ctx.write_text(
        "current: wrong\ncontexts:\n"
        f"  wrong: {{broker: '{fleet['broker']}', prefix: elsewhere, store: '{fleet['store']}', key: '{fleet['key']}'}}\n"
    )
    env = {"EDGE_AGENT_FLEET_CONTEXTS": str(ctx)}
    pkg = sample_tiny_package(fleet["tmp"] / "tiny", version="5")
    args = ["fleet", "push", pkg, "--name", "tiny", "--version", "5", "--device", "pi-1", "--wait", 11, "--json"]
    out = run_cli(*args, env=env)
    assert out.returncode != 0, out.stdout
    reason = json.loads(out.stdout)["devices"]["pi-1"]["reason"]
    assert "no device has a status under prefix 'elsewhere'" in reason and "devices report under: edge" in reason
    # issue 28: progress from the start and while nothing happens (JSON lines on stderr with --json): the first
    # line comes before the package is stored, then a heartbeat repeats the step every 5 s (the typical gap: a
    # starved thread on a loaded machine may be late, and tests do not assert wall time)
    said = [json.loads(ln) for ln in out.stderr.splitlines() if ln.startswith("{")]
    assert [d["event"] for d in said[:2]] == ["store", "published"] and all(d["progress"] == "push" for d in said)
    beats = [d for d in said if d["event"] == "heartbeat"]
    assert beats and all(d["step"].startswith("published version 5") for d in beats), said
    gaps = sorted(b["elapsed_s"] - a["elapsed_s"] for a, b in zip(said, said[1:]))
    assert gaps[len(gaps) // 2] <= 5.5, gaps

    seen = []

    def on(topic, payload, retained):
        seen.append((topic, payload))

    from agent.transport.mqtt import BrokerConfig, MqttLink

    def retained_desired():
        seen.clear()
        link = MqttLink(BrokerConfig(fleet["broker"])).start()
        link.subscribe("elsewhere/devices/pi-1/desired/tiny", on)
        link.wait_subscribed(5)
        time.sleep(0.5)
        link.stop()
        return [p for _, p in seen if p]

    assert retained_desired(), "the push left a retained desired state under the wrong prefix"
    cleared = run_cli("fleet", "clear", "tiny", "--device", "pi-1", "--json", env=env)
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["cleared"] == ["elsewhere/devices/pi-1/desired/tiny"]
    assert retained_desired() == []
    # the command line beats the context: the right prefix, given explicitly, reaches pi-1
    ok = run_cli(*args[:-3], "--wait", 90, "--prefix", "edge", "--json", env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["devices"]["pi-1"]["result"] == "committed", ok.stderr
    bad = run_cli("fleet", "--context", "nope", "status", env=env)
    assert bad.returncode != 0 and "no context 'nope' (contexts: wrong)" in bad.stderr
