"""The control plane believes only signed reports: devices sign status and events with their own key, the
registry (STORE/registry.json) holds their public keys and groups. A fake "committed" from an unregistered or
unsigned device does not make `fleet push --wait` succeed; a claimed group the registry does not give is ignored."""

from __future__ import annotations

import json
import subprocess

from mqtt_support import ControlPlane, mqtt_config
from test_daemon_support import EXE, ROOT, fast

from agent.app import DeviceAgent
from agent.fleet.push import push
from agent.fleet.registry import DeviceRegistry
from agent.fleet.status import fleet_status
from agent.samples import sample_tiny_package
from agent.transport.mqtt import BrokerConfig


def _fake_status(cp, device, version, groups=("lab",)):
    doc = {
        "device_id": device,
        "online": True,
        "groups": list(groups),
        "models": {"tiny": {"version": version, "state": "committed", "provider": "cpu"}},
        "deployments": {"tiny": {"id": "x", "version": version, "state": "committed", "result": "committed"}},
    }
    cp.publish(cp.topics.status(device), json.dumps(doc).encode())


def test_only_signed_reports_of_registered_devices_count(tmp_path, mosquitto):
    cp = ControlPlane(tmp_path / "cp", mosquitto)
    cp.serve()
    cfg, cfg_path = mqtt_config(tmp_path / "dev", mosquitto, cp, groups=("lab",))
    # install: the device key, registered with the control plane (CLI, as an operator would)
    out = subprocess.run(
        EXE + ["keys", "device", "--config", str(cfg_path), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    key = json.loads(out.stdout)
    out = subprocess.run(
        EXE
        + [
            "fleet",
            "register",
            "dev-1",
            "--public-key",
            key["public_key_file"],
            "--group",
            "lab",
            "--store",
            str(cp.store_dir),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # dev-2 is registered, but what is published under its name is unsigned
    from agent.artifacts.keys import device_key, public_pem

    reg = DeviceRegistry.load(cp.store_dir / "registry.json")
    reg.register("dev-2", public_pem(device_key(tmp_path / "dev2-state").public_key()), ["lab"])
    reg.save()
    a = DeviceAgent(cfg, step_config=fast(), serve_http=False, providers=["cpu"]).start()
    broker = BrokerConfig(mosquitto.url)
    try:
        pkg = sample_tiny_package(tmp_path / "pkg", version="1")
        common = dict(name="tiny", key_file=cp.keyfile, store=cp.store_dir, broker=broker, validate=False)
        # fake committed reports: an unregistered device and a registered one whose report is unsigned
        _fake_status(cp, "ghost", "1")
        _fake_status(cp, "dev-2", "1")
        for fake in ("ghost", "dev-2"):
            doc = push(pkg, version="1", devices=[fake], wait=8, **common)
            assert doc["ok"] is False, doc
            assert "not counted" in doc["devices"][fake]["reason"], doc
        # a group push: the real, signed dev-1 counts; the intruder claiming group lab is not a member
        _fake_status(cp, "intruder", "2", groups=("lab",))
        doc = push(pkg, version="2", groups=["lab"], wait=45, **common)
        assert doc["devices"]["dev-1"]["result"] == "committed", doc
        assert "intruder" not in doc["devices"] and "ghost" not in doc["devices"]
        assert doc["devices"]["dev-2"]["result"] != "committed"  # registered member, unsigned report
        assert doc["ok"] is False
        rows = {
            r["device_id"]: r
            for r in fleet_status(broker, registry=DeviceRegistry.load(cp.store_dir / "registry.json"))["devices"]
        }
        assert rows["dev-1"]["trust"] == "verified" and rows["dev-1"]["models"]["tiny"]["version"] == "2"
        assert rows["ghost"]["trust"] == "unregistered" and rows["ghost"]["models"] == {}
        assert rows["dev-2"]["trust"] == "unsigned" and "models" in rows["dev-2"]["unverified_claims"]
        assert rows["intruder"]["groups"] == []
    finally:
        a.stop()
        cp.close()
