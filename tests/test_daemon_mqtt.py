"""MQTT mode end to end: a real Mosquitto, `edge-agent fleet serve`, the daemon, `edge-agent fleet push --wait`."""

from __future__ import annotations

import json
import subprocess

from support.daemon import EXE, ROOT, Daemon, fleet_server, infer, wait_for, write_config
from support.mqtt import register_device

from agent.artifacts.keys import generate
from agent.samples import sample_tiny_package


def _push(tmp_path, broker, keyfile, version, *extra):
    pkg = sample_tiny_package(tmp_path / f"pkg-{version}", version=version)
    cmd = EXE + [
        "fleet",
        "push",
        str(pkg),
        "--name",
        "tiny",
        "--version",
        version,
        "--device",
        "dev-1",
        "--key",
        str(keyfile),
        "--store",
        str(tmp_path / "cp-store"),
        "--broker",
        broker.url,
        "--wait",
        "120",
        "--json",
        *extra,
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else {}), out.stderr


def test_push_wait_deploys_rejects_untrusted_and_rolls_back(tmp_path, mosquitto):
    keyfile, pubfile, _ = generate(tmp_path / "keys")
    cfg = write_config(tmp_path / "dev", mqtt={"url": mosquitto.url}, extra={"trust": {"public_keys": [str(pubfile)]}})
    (tmp_path / "cp-store").mkdir()
    register_device(tmp_path / "cp-store", "dev-1", tmp_path / "dev" / "state")  # push --wait believes its reports
    server = fleet_server(tmp_path / "cp-store", mosquitto.url)
    d = Daemon(cfg, tmp_path / "dev" / "state")
    try:
        d.wait_ready()
        rc, doc, err = _push(tmp_path, mosquitto, keyfile, "1")
        assert rc == 0 and doc["ok"] and doc["devices"]["dev-1"]["result"] == "committed", (err, d.tail())
        assert infer(d.url) == ("1", [1.0] * 4)

        rc, doc, err = _push(tmp_path, mosquitto, keyfile, "2")
        assert rc == 0 and doc["devices"]["dev-1"]["result"] == "committed", (err, d.tail())
        assert infer(d.url) == ("2", [2.0] * 4)
        status = wait_for(
            lambda: (d.status() or {}).get("models", {}).get("tiny", {}).get("version") == "2" and d.status(),
            what="status v2",
        )
        assert status["models"]["tiny"]["provider"] == "cpu" and status["mode"] == "mqtt"

        # signed by a key the device does not trust: rejected before download, version 2 keeps serving
        other, _, _ = generate(tmp_path / "other-keys")
        rc, doc, err = _push(tmp_path, mosquitto, other, "3")
        assert doc["ok"] is False and doc["devices"]["dev-1"]["result"] == "rejected", (doc, err)
        assert "untrusted" in doc["devices"]["dev-1"]["reason"]
        assert infer(d.url) == ("2", [2.0] * 4)

        # an explicit signed rollback to an older version is accepted
        rc, doc, err = _push(tmp_path, mosquitto, keyfile, "1.5", "--rollback")
        assert rc == 0 and doc["devices"]["dev-1"]["result"] == "committed", (doc, err, d.tail())
        assert infer(d.url) == ("1.5", [1.5] * 4)
    finally:
        assert d.terminate() == 0, d.tail()
        server.terminate()
        server.wait(30)
