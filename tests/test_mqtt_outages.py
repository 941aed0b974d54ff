"""Transient failures mid-pull recover without a new push: the broker gone, the artifact server gone, each for
EDGE_AGENT_TEST_OUTAGE_S seconds (default 12; the issue's figure is 60). The same deployment retries with
backoff and jitter and keeps each reason; it commits the verified version once the outage ends."""

from __future__ import annotations

import os
import random
import time

import pytest
from support.agent import make_agent
from support.mqtt import ControlPlane, mqtt_config, wait_for
from test_daemon_mqtt_crash import CHUNK, SlowServer, _on_disk

from agent.artifacts.store import ContentStore
from agent.samples import sample_tiny_package
from agent.transport.mqtt import BrokerConfig

OUTAGE_S = float(os.environ.get("EDGE_AGENT_TEST_OUTAGE_S", "12"))
PAD = 2 * 1024 * 1024


@pytest.mark.parametrize("what", ["broker", "artifact-server"])
def test_an_outage_mid_pull_recovers_without_a_new_push(tmp_path, mosquitto, what):
    cp = ControlPlane(tmp_path / "cp", mosquitto, chunk_size=CHUNK)
    server = SlowServer(ContentStore(cp.store_dir), BrokerConfig(mosquitto.url)).start()
    server.delay = 0.05
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, cp)
    events: list[dict] = []
    stall_s = min(30.0, OUTAGE_S / 4)  # an attempt fails during the outage: the retry path is exercised
    a = make_agent(None, config=cfg, stall_s=stall_s, on_event=events.append, serve_http=False, known_providers=["cpu"])
    a.start()
    try:
        pkg = sample_tiny_package(tmp_path / "pkg-1", version="1")
        (pkg / "padding.bin").write_bytes(random.Random(1).randbytes(PAD))
        m = cp.manifest(pkg, "tiny", "1")
        cp.to_device("tiny", cp.envelope(m))
        wait_for(lambda: len(_on_disk(a.state_dir, m)) >= m.artifact.count // 5, 120, "a fifth of the pull")
        started = time.monotonic()
        if what == "broker":
            mosquitto.kill()
        else:
            server.stop()
        have = len(_on_disk(a.state_dir, m))
        retrying = wait_for(lambda: a.status().get("retrying", {}).get("tiny"), OUTAGE_S + 60, "a retry in status")
        assert "stalled" in retrying["reason"] and retrying["attempt"] >= 1
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))  # the rest of the outage
        assert not a.store.has(m.artifact.sha256), "the pull finished during the outage"
        assert len(_on_disk(a.state_dir, m)) < m.artifact.count
        if what == "broker":
            mosquitto.start()
        else:
            server = SlowServer(ContentStore(cp.store_dir), BrokerConfig(mosquitto.url)).start()
            server.delay = 0.05
        deps = wait_for(
            lambda: [d for d in a.orchestrator.journal.all() if d.model == "tiny" and d.terminal] or None,
            240,
            "the deployment to end",
        )
        recovered = time.monotonic() - started
        assert [(d.version, d.state.value) for d in deps] == [("1", "committed")], deps[-1].reason
        assert len(a.orchestrator.journal.all()) == 1  # the same deployment, no new push
        assert "retrying" not in a.status()  # over once it moved on
        retries = [e for e in events if e.get("progress") == "retry"]
        assert retries and all(e.get("reason") for e in retries), "each retry carries its reason"
        assert any("stalled" in e["reason"] for e in retries), retries[-1]
        waits = [e["wait_s"] for e in retries]
        print(
            f"\n{what} outage {OUTAGE_S:.0f} s at {have}/{m.artifact.count} chunks: committed "
            f"{recovered:.1f} s after the cut, {len(retries)} retries, waits {waits}"
        )
    finally:
        a.stop()
        server.stop()
        cp.close()
