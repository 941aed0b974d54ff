"""The simulator's device classes (captured sysroots -> target and providers), its shared qualification cache,
and `edge-agent fleet simulate` as a process that starts, reports its layout and stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hostruntime import ort_openvino_devices

from agent import sysroots as captures
from agent.errors import ConfigError, LifecycleError
from agent.sim.classes import QualificationCache, discover_sysroots, load_classes, resolve_sysroots

SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
NOT_DEVICES = Path(__file__).parent / "fixtures" / "sysroots"  # garbage, empty: test-only trees


def test_classes_come_from_captured_sysroots_and_keep_only_providers_this_host_can_stand_in_for():
    classes = {c.name: c for c in load_classes(discover_sysroots(), strict=False)}
    assert "empty" not in classes and "garbage" not in classes  # not device captures: not shipped
    pi, nuc = classes["rpi5-8gb"], classes["intel-nuc-meteorlake"]
    assert pi.target == "raspberry-pi-5" and pi.providers == ("cpu",)
    assert "only cpu numerics are real here" in pi.why["xnnpack"]
    assert nuc.target == "intel-x86_64" and nuc.providers[0] == "openvino" and "cpu" in nuc.providers
    if ort_openvino_devices():  # this host's plugin runs (an Intel CPU): the NUC class may use it
        assert "ort-openvino" in nuc.providers
    else:
        assert "Intel devices only" in nuc.why["ort-openvino"]  # the real probe's reason, not an invented one
    jetson = classes["jetson-orin-nano-jp6"]
    assert jetson.profile.arch == "aarch64" and jetson.providers == ("cpu",) and "tensorrt" in jetson.why


def test_a_named_sysroot_that_is_not_a_device_is_an_error():
    with pytest.raises(ConfigError, match="no CPU architecture readable"):
        load_classes([str(NOT_DEVICES / "empty")])
    with pytest.raises(ConfigError, match="is not a directory"):
        load_classes([str(SYSROOTS / "no-such-board")])
    assert resolve_sysroots("rpi4-4gb, amd-epyc-x86") == [str(SYSROOTS / "rpi4-4gb"), str(SYSROOTS / "amd-epyc-x86")]


def test_qualification_cache_measures_once_per_key_while_identical_devices_wait():
    cache, calls, started = QualificationCache(), [], threading.Event()
    release = threading.Event()

    def measure():
        calls.append(1)
        started.set()
        release.wait(30)
        return {"selected": "cpu"}

    out: list = []
    threads = [
        threading.Thread(target=lambda i=i: out.append(cache.get(("sha", "t", ("cpu",)), f"d{i}", measure)))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    assert started.wait(30)
    release.set()
    for t in threads:
        t.join(30)
    assert len(calls) == 1 and out == [{"selected": "cpu"}] * 8
    assert cache.stats() == {"measured": 1, "reused": 7}
    cache.get(("sha", "t", ("openvino", "cpu")), "d9", measure)  # another provider set is another measurement
    assert len(calls) == 2

    def broken():
        raise RuntimeError("child died")

    with pytest.raises(RuntimeError):
        cache.get(("x", "t", ()), "d1", broken)
    assert cache.get(("x", "t", ()), "d2", lambda: "ok") == "ok"  # failures to measure are never cached


def test_a_device_waiting_for_another_to_measure_still_hears_its_cancel():
    """A halted rollout cancels every device of a class, also those waiting on the one measuring (before, they sat
    on a plain lock until that measurement ended, deaf to the cancel and to their state's deadline)."""
    cache, started, release = QualificationCache(), threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(60)
        return "decision"

    first = threading.Thread(target=lambda: cache.get(("k",), "d1", slow))
    first.start()
    try:
        assert started.wait(30)
        cancelled = threading.Event()

        def check():
            if cancelled.is_set():
                raise LifecycleError("cancelled")

        got: list = []

        def waiter():
            try:
                got.append(cache.get(("k",), "d2", lambda: "never", check=check))
            except LifecycleError as exc:
                got.append(exc)

        t = threading.Thread(target=waiter)
        t.start()
        cancelled.set()
        t.join(10)
        assert not t.is_alive(), "the waiting device never heard its cancel"
        assert len(got) == 1 and isinstance(got[0], LifecycleError)
    finally:
        release.set()
        first.join(30)
    assert cache.get(("k",), "d3", lambda: "never") == "decision"  # the measuring device's result still stands


def test_simulate_cli_runs_real_agents_until_sigterm(mosquitto, tmp_path):
    from agent.artifacts.keys import generate

    _, pub, _ = generate(tmp_path / "keys")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "fleet",
            "simulate",
            "--devices",
            "3",
            "--trust",
            str(pub),
            "--sysroots",
            "rpi4-4gb,amd-epyc-x86",
            "--group",
            "lab",
            "--broker",
            mosquitto.url,
            "--state-dir",
            str(tmp_path / "fleet"),
            "--store",
            str(tmp_path / "cp-store"),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = json.loads(proc.stdout.readline())
        assert started["event"] == "started" and started["devices"] == 3
        assert started["classes"] == {"rpi4-4gb": 2, "amd-epyc-x86": 1}
        assert started["providers"] == {"rpi4-4gb": ["cpu"], "amd-epyc-x86": ["openvino", "cpu"]}
        from agent.fleet.registry import registry_for_store
        from agent.fleet.watch import fleet_status
        from agent.transport.mqtt import BrokerConfig

        registry = registry_for_store(tmp_path / "cp-store")  # the simulator registered its devices
        assert registry is not None and registry.members("lab") == [
            "sim-amd-epyc-x86-1",
            "sim-rpi4-4gb-1",
            "sim-rpi4-4gb-2",
        ]
        rows = {r["device_id"]: r for r in fleet_status(BrokerConfig(mosquitto.url), registry=registry)["devices"]}
        assert set(rows) == {"sim-rpi4-4gb-1", "sim-rpi4-4gb-2", "sim-amd-epyc-x86-1"}
        assert all(r["online"] and r["groups"] == ["lab"] and r["trust"] == "verified" for r in rows.values())
        assert rows["sim-rpi4-4gb-1"]["target"] == "raspberry-pi-4"
        proc.send_signal(signal.SIGTERM)
        stopped = json.loads(proc.stdout.readline())
        assert stopped["event"] == "stopped" and stopped["qualification"] == {"measured": 0, "reused": 0}
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert (tmp_path / "fleet" / "sim-rpi4-4gb-1" / "status.json").is_file()  # each device has its own state


def test_rollout_through_nats_mqtt_gateway_unchanged(nats_mqtt, tmp_path):
    """The same rollout over a second, clusterable MQTT implementation (NATS speaks MQTT 3.1.1 only: no shared
    subscriptions, retained messages in JetStream)."""
    from agent.artifacts.keys import generate
    from agent.artifacts.store import ContentStore
    from agent.fleet.artifact_server import ArtifactServer
    from agent.fleet.rollout_plan import RolloutSpec
    from agent.fleet.rollout_run import run_rollout
    from agent.samples import sample_tiny_package
    from agent.sim.simulator import Simulator
    from agent.transport.mqtt import BrokerConfig

    key, pub, _ = generate(tmp_path / "keys")
    cfg = BrokerConfig(nats_mqtt.url)
    server = ArtifactServer(ContentStore(tmp_path / "store"), cfg).start()
    sim = Simulator(
        4,
        broker=cfg,
        trust=[str(pub)],
        groups=["n"],
        store=tmp_path / "store",  # registers the simulated devices, so the rollout believes them
        sysroots=[str(SYSROOTS / "rpi5-8gb"), str(SYSROOTS / "amd-epyc-x86")],
    )
    try:
        sim.start()
        spec = RolloutSpec("tiny", "1", group="n", cohort_by="target", canary="1", deadline_s=120).validate()
        summary = run_rollout(
            sample_tiny_package(tmp_path / "pkg", version="1"),
            spec,
            key_file=key,
            store=tmp_path / "store",
            broker=cfg,
            wait=True,
            tick_s=0.5,
        )
    finally:
        sim.stop()
        server.stop()
    assert summary["state"] == "completed" and summary["counts"] == {"succeeded": 4}, summary
    assert set(summary["cohorts"]) == {"raspberry-pi-5", "generic-x86_64"}
    from agent.fleet.registry import registry_for_store

    # its devices' keys went with its temporary state directory: it took them out of the registry again
    assert registry_for_store(tmp_path / "store").devices == {}
