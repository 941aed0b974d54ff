"""kill -9 of the daemon in MQTT mode: at every lifecycle state, and at random points mid-download. Every restart
resumes (once the link is up), commits the verified version, and never asks again for a chunk already on disk.

EDGE_AGENT_TEST_KILLS sets the number of random mid-download kills (default 10)."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import threading
import time

import pytest
from support.daemon import RESTART_OUTCOME, Daemon, infer, wait_for, write_config
from support.mqtt import ControlPlane

from agent.artifacts import chunks
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.lifecycle.fsck import check_state_dir
from agent.lifecycle.journal import Journal
from agent.lifecycle.slots import ModelSlots
from agent.samples import sample_tiny_package
from agent.transport.mqtt import BrokerConfig, MqttLink

EXPECT = RESTART_OUTCOME  # state journaled when the daemon dies -> version serving after restart, end state
CHUNK = 16 * 1024
PAD = 3 * 1024 * 1024  # bytes of padding in v2's package: ~190 chunks, a download worth interrupting


class SlowServer(ArtifactServer):
    """A real artifact server that takes `delay` s per chunk (a slow uplink), so kills land mid-download."""

    delay = 0.0

    def _answer(self, req, index):
        if self.delay:
            time.sleep(self.delay)
        return super()._answer(req, index)


class Requests:
    """Records the chunk indices the device asks for (a second subscriber on the request topic)."""

    def __init__(self, broker):
        self.seen: list[int] = []
        self._lock = threading.Lock()
        self.link = MqttLink(BrokerConfig(broker.url)).start(wait=15)
        self.link.subscribe("edge/artifacts/req/+", self._on, qos=1)

    def _on(self, topic, payload, retained):
        try:
            req = chunks.decode_request(payload)
        except Exception:  # noqa: BLE001
            return
        with self._lock:
            self.seen.extend(req.indices)

    def take(self) -> list[int]:
        with self._lock:
            out, self.seen = self.seen, []
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One broker and control plane; a state_dir where v1 was committed in MQTT mode; v2 retained for dev-1."""
    from brokers import Mosquitto

    base = tmp_path_factory.mktemp("mqtt-crash")
    with Mosquitto(base / "broker") as broker:
        cp = ControlPlane(base / "cp", broker, chunk_size=CHUNK)
        server = SlowServer(ContentStore(cp.store_dir), BrokerConfig(broker.url)).start()
        cfg = _config(base / "seed", broker, cp)
        v1 = cp.manifest(sample_tiny_package(base / "pkg-1", version="1"), "tiny", "1")
        cp.to_device("tiny", cp.envelope(v1))
        d = Daemon(cfg, base / "seed" / "state")
        try:
            assert d.wait_deployment("1")["result"] == "committed", d.tail()
        finally:
            assert d.terminate() == 0, d.tail()
        pkg2 = sample_tiny_package(base / "pkg-2", version="2")
        (pkg2 / "padding.bin").write_bytes(random.Random(2).randbytes(PAD))
        v2 = cp.manifest(pkg2, "tiny", "2")
        cp.to_device("tiny", cp.envelope(v2))
        yield {"broker": broker, "cp": cp, "server": server, "seed": base / "seed" / "state", "v2": v2}
        server.stop()
        cp.close()


def _config(directory, broker, cp):
    return write_config(directory, mqtt={"url": broker.url}, extra={"trust": {"public_keys": [str(cp.pubfile)]}})


def _copy(world, tmp_path):
    cfg = _config(tmp_path, world["broker"], world["cp"])
    shutil.copytree(world["seed"], tmp_path / "state")
    (tmp_path / "state" / "status.json").unlink()
    return cfg, tmp_path / "state"


def _on_disk(state_dir, m) -> set[int]:
    """Chunks whose bytes in the staging file already match the manifest (what must never be fetched again)."""
    part = state_dir / "staging" / f"{m.artifact.sha256}.part"
    if not part.exists():
        return set()
    data = part.read_bytes()
    a = m.artifact
    return {
        i
        for i in range(a.count)
        if hashlib.sha256(data[i * a.chunk_size : i * a.chunk_size + a.chunk_len(i)]).hexdigest() == a.chunks[i]
    }


def _check_committed(d, state_dir, version, end):
    dep = d.wait_deployment("2", timeout=240)
    assert dep["state"] == end, d.tail()
    assert infer(d.url) == (version, [float(version)] * 4)
    assert ModelSlots(state_dir).committed("tiny").version == version
    assert Journal(state_dir).in_flight() == []
    assert check_state_dir(state_dir) == []
    return dep


@pytest.mark.parametrize("state", list(EXPECT))
def test_sigkill_in_every_state_recovers_in_mqtt_mode(world, tmp_path, state):
    cfg, state_dir = _copy(world, tmp_path)
    crashing = Daemon(cfg, state_dir, env={"EDGE_AGENT_TEST_CRASH_AT": state})
    assert crashing.proc.wait(180) == -9, crashing.tail()
    died_in = [d for d in Journal(state_dir).all() if d.version == "2"]
    assert len(died_in) == 1 and died_in[0].state.value == state, crashing.tail()

    version, end = EXPECT[state]
    d = Daemon(cfg, state_dir)
    try:
        dep = _check_committed(d, state_dir, version, end)
        if end == "rolled_back":
            assert f"during {state}" in dep["reason"]
        assert "TypeError" not in d.tail()
    finally:
        assert d.terminate() == 0, d.tail()


def test_random_kills_mid_download_never_fetch_a_chunk_twice(world, tmp_path):
    """SIGKILL at random points of one download, restart each time: each restart asks only for chunks not on
    disk; the last one commits the verified v2."""
    kills = int(os.environ.get("EDGE_AGENT_TEST_KILLS", "10"))
    m, server = world["v2"], world["server"]
    count = m.artifact.count
    rng = random.Random(int(os.environ.get("EDGE_AGENT_TEST_SEED", "14")))
    cfg, state_dir = _copy(world, tmp_path)
    sniff = Requests(world["broker"])
    server.delay = 0.01
    try:
        for n in range(kills):
            have = _on_disk(state_dir, m)
            sniff.take()
            d = Daemon(cfg, state_dir)
            target = len(have) + max(1, rng.randint(1, max(1, (count - len(have)) // (kills - n + 1))))
            wait_for(lambda t=target: len(_on_disk(state_dir, m)) >= min(t, count - 1), 180, f"kill {n}", d.proc)
            d.proc.send_signal(signal.SIGKILL)
            assert d.proc.wait(60) == -9
            asked = set(sniff.take())
            again = asked & have
            assert not again, f"restart {n} asked again for {len(again)} chunk(s) already on disk: {sorted(again)[:10]}"
            assert len(_on_disk(state_dir, m)) > len(have), f"restart {n} made no progress"
        have = _on_disk(state_dir, m)
        sniff.take()
        d = Daemon(cfg, state_dir)
        try:
            _check_committed(d, state_dir, "2", "committed")
            assert not set(sniff.take()) & have
            assert "TypeError" not in d.tail()
        finally:
            assert d.terminate() == 0, d.tail()
    finally:
        server.delay = 0.0
        sniff.link.stop()
