"""Delta pulls end to end: `fleet push` (delta-capable by default), `fleet serve`, the daemon; status --json
reports per deployment what moved (`bytes_fetched`) and what came from the version it held (`bytes_reused`)."""

from __future__ import annotations

import json
import subprocess

from clirunner import edge_agent
from delta_models import versions
from support.daemon import EXE, ROOT, Daemon, fleet_server, write_config
from support.mqtt import register_device
from support.wait import wait_for

from agent.artifacts.keys import generate


def _push(tmp_path, broker, keyfile, package, version):
    cmd = EXE + ["fleet", "push", str(package), "--name", "mlp", "--version", version, "--device", "dev-1"]
    cmd += ["--key", str(keyfile), "--store", str(tmp_path / "cp-store"), "--broker", broker.url]
    out = subprocess.run(cmd + ["--wait", "150", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=200)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else {}), out.stderr


def test_second_version_moves_only_the_changed_tensor(tmp_path, mosquitto):
    v1, v2, changed = versions(tmp_path, layers=4, width=512)
    keyfile, pubfile, _ = generate(tmp_path / "keys")
    cfg = write_config(tmp_path / "dev", mqtt={"url": mosquitto.url}, extra={"trust": {"public_keys": [str(pubfile)]}})
    register_device(tmp_path / "cp-store", "dev-1", tmp_path / "dev" / "state")
    server = fleet_server(tmp_path / "cp-store", mosquitto.url)
    d = Daemon(cfg, tmp_path / "dev" / "state")
    try:
        d.wait_ready()
        rc, doc, err = _push(tmp_path, mosquitto, keyfile, v1, "1")
        assert rc == 0 and doc["devices"]["dev-1"]["result"] == "committed", (err, d.tail())
        first = wait_for(lambda: ((d.status() or {}).get("deployments") or {}).get("mlp"), what="deployment 1")
        assert first["bytes_fetched"] == v1.stat().st_size and first["bytes_reused"] == 0

        rc, doc, err = _push(tmp_path, mosquitto, keyfile, v2, "2")
        assert rc == 0 and doc["devices"]["dev-1"]["result"] == "committed", (err, d.tail())
        dep = wait_for(
            lambda: (
                (((d.status() or {}).get("deployments") or {}).get("mlp") or {}).get("version") == "2"
                and d.status()["deployments"]["mlp"]
            ),
            what="deployment 2",
        )
        assert dep["state"] == "committed"
        assert changed <= dep["bytes_fetched"] <= 1.1 * changed, dep
        assert dep["bytes_fetched"] + dep["bytes_reused"] == v2.stat().st_size
        # the operator's view: `edge-agent status --json` names the same two fields for the deployment
        out = edge_agent("status", "--config", cfg, "--json")
        shown = json.loads(out.stdout)["deployments"]["mlp"]
        assert out.returncode == 0 and shown["version"] == "2", out.stderr
        assert (shown["bytes_fetched"], shown["bytes_reused"]) == (dep["bytes_fetched"], dep["bytes_reused"]), shown

        # the device signed its qualification and its trial verdict, kept them and published them
        files = sorted((tmp_path / "dev" / "state" / "attestations").glob(f"{dep['id']}.*.intoto.json"))
        assert [f.name.split(".")[1] for f in files] == ["qualification", "trial"]
        pub = tmp_path / "dev" / "state" / "device.pub"
        out = edge_agent("attestation", "verify", files[1], "--device-key", pub, "--device", "dev-1", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["verdict"] == "committed", out.stderr
        out = edge_agent(
            "fleet",
            "attestations",
            "--store",
            tmp_path / "cp-store",
            "--broker",
            mosquitto.url,
            "--model",
            "mlp",
            "--json",
        )
        rows = json.loads(out.stdout)
        assert {(r["kind"], r["version"], r["verified"]) for r in rows} == {
            ("qualification", "2", True),
            ("trial", "2", True),
        }
    finally:
        assert d.terminate() == 0, d.tail()
        server.terminate()
        server.wait(30)
