"""Attestations from simulated devices (`fleet simulate`: real DeviceAgents): published, listed and verified by
`fleet attestations`; one saved to a file verifies offline with its device's key, fails with one byte changed,
and is refused under another device's key."""

import json
import subprocess
import sys

from clirunner import edge_agent
from support.stop import stop

from agent.artifacts.keys import generate
from agent.samples import sample_tiny_package


def test_simulated_devices_publish_attestations_that_verify_offline(mosquitto, tmp_path):
    key, pub, _ = generate(tmp_path / "keys")
    store = tmp_path / "cp-store"
    sim = subprocess.Popen(
        [sys.executable, "-m", "agent", "fleet", "simulate", "--devices", "2", "--trust", str(pub)]
        + ["--sysroots", "rpi4-4gb", "--group", "lab", "--broker", mosquitto.url]
        + ["--state-dir", str(tmp_path / "fleet"), "--store", str(store), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    from agent.artifacts.store import ContentStore
    from agent.fleet.artifact_server import ArtifactServer
    from agent.transport.mqtt import BrokerConfig

    server = ArtifactServer(ContentStore(store), BrokerConfig(mosquitto.url)).start()
    try:
        assert json.loads(sim.stdout.readline())["event"] == "started"
        pkg = sample_tiny_package(tmp_path / "pkg", version="1")
        out = edge_agent(
            "fleet", "push", pkg, "--name", "tiny", "--version", "1", "--group", "lab", "--key", key,
            "--store", store, "--broker", mosquitto.url, "--wait", "240", "--json",
        )  # fmt: skip
        assert out.returncode == 0, (out.stdout, out.stderr)
        out = edge_agent("fleet", "attestations", "--store", store, "--broker", mosquitto.url, "--json")
        rows = json.loads(out.stdout)
        devices = {"sim-rpi4-4gb-1", "sim-rpi4-4gb-2"}
        got = {(r["device"], r["kind"]) for r in rows if r["verified"]}
        assert got == {(d, k) for d in devices for k in ("qualification", "trial")}, rows

        from agent.fleet.attestations import collect

        env = next(i[3] for i in collect(BrokerConfig(mosquitto.url)) if i[0] == "sim-rpi4-4gb-1" and i[2] == "trial")
        (tmp_path / "att.json").write_bytes(env)
        bad = bytearray(env)
        bad[len(env) // 3] ^= 0x01
        (tmp_path / "bad.json").write_bytes(bytes(bad))
        registry = json.loads((store / "registry.json").read_text())["devices"]
        for dev in devices:
            (tmp_path / f"{dev}.pub").write_text(registry[dev]["public_key"])
        ok = edge_agent("attestation", "verify", tmp_path / "att.json", "--device-key", tmp_path / "sim-rpi4-4gb-1.pub")
        assert ok.returncode == 0 and "verified: trial of tiny 1 by device sim-rpi4-4gb-1" in ok.stdout, ok.stderr
        changed = edge_agent(
            "attestation", "verify", tmp_path / "bad.json", "--device-key", tmp_path / "sim-rpi4-4gb-1.pub"
        )
        assert changed.returncode != 0, changed.stdout
        other = edge_agent(
            "attestation", "verify", tmp_path / "att.json", "--device-key", tmp_path / "sim-rpi4-4gb-2.pub"
        )
        assert other.returncode != 0 and "not by the expected device key" in other.stderr
    finally:
        server.stop()
        stop(sim, 60)
