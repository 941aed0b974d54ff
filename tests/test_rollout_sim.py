"""Rollouts against simulated fleets: real Mosquitto, real DeviceAgents (one MQTT client, state directory and
captured-sysroot hardware profile each), real artifact pulls and real qualification.

The failing model: a generated CNN whose model.yaml pins the `cpu` provider to 1e-9 of the golden outputs
(computed by onnx's reference evaluator). ORT CPU's fp32 kernels sum in another order and land ~1e-7 away, so
qualification measures an accuracy failure on every device that only has `cpu` (the simulated Raspberry Pis:
an aarch64 class on this x86 host keeps only the cpu provider), while x86 classes select openvino and pass.
The failure is measured, not injected; only the threshold is unusually strict.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from brokers import Mosquitto

from agent import sysroots as captures
from agent.artifacts.keys import generate
from agent.artifacts.store import ContentStore
from agent.cli.fleet_rollout import render_rollouts
from agent.fleet import rollout_state as rs
from agent.fleet.artifact_server import ArtifactServer
from agent.fleet.rollout_plan import RolloutSpec
from agent.fleet.rollout_run import run_rollback, run_rollout
from agent.samples import cnn_model, tiny_model, write_package
from agent.sim.simulator import Simulator
from agent.transport.mqtt import BrokerConfig

ROOT = Path(__file__).resolve().parent.parent
SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
MIXED = ["rpi4-4gb", "rpi5-8gb", "jetson-orin-nano-jp6", "qualcomm-qcs6490", "intel-nuc-meteorlake", "amd-epyc-x86"]
STRICT_CPU = {"tolerances": {"cpu": {"max_abs": 1.0e-9, "max_rel": 1.0e-9}}}
WAIT_S = 120.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    with Mosquitto(tmp / "mosquitto") as broker:
        key, pub, _ = generate(tmp / "keys")
        cfg = BrokerConfig(broker.url)
        store = tmp / "store"
        server = ArtifactServer(ContentStore(store), cfg).start()
        sims = []
        try:

            def simulator(n, group, classes, prefix):
                sim = Simulator(
                    n,
                    broker=cfg,
                    trust=[str(pub)],
                    groups=[group],
                    id_prefix=prefix,
                    sysroots=[str(SYSROOTS / c) for c in classes],
                    state_dir=str(tmp / prefix),
                    store=store,  # registers its devices: the rollouts believe their signed reports
                    probation_s=1.0,  # each wave waits for its devices' probation: 1 s, not the simulator's 2
                )
                sims.append(sim.start())
                return sim

            yield SimpleNamespace(tmp=tmp, broker=broker, cfg=cfg, key=key, pub=pub, store=store, simulator=simulator)
        finally:
            for sim in sims:
                sim.stop()
            server.stop()


def _signer(fleet) -> list[str]:
    """The fleet command's signing key, store and broker."""
    return ["--key", str(fleet.key), "--store", str(fleet.store), "--broker", fleet.broker.url]


@pytest.fixture(scope="module")
def pair(fleet):
    """Three x86 (openvino + cpu) and three Raspberry Pi 5 (cpu only) devices in group 'pair'."""
    return fleet.simulator(6, "pair", ["amd-epyc-x86", "rpi5-8gb"], "pr")


def _roll(fleet, package, name, version, group, **kw):
    spec = RolloutSpec(name, version, group=group, **{"deadline_s": WAIT_S, **kw}).validate()
    return run_rollout(package, spec, key_file=fleet.key, store=fleet.store, broker=fleet.cfg, wait=True, tick_s=0.5)


def _package(tmp, name, version, model=None, extra=None):
    return write_package(
        tmp / f"{name}-{version}",
        model if model is not None else tiny_model(float(version)),
        name=name,
        version=version,
        extra_yaml=extra,
    )


def _results(summary):
    return {d["device_id"]: d for d in summary["devices"]}


def _model(sim, dev, name):
    return sim.agents[dev].status()["models"].get(name) or {}


def test_good_model_reaches_20_mixed_devices_cohort_by_cohort_in_waves(fleet):
    sim = fleet.simulator(20, "mixed", MIXED, "mx")
    summary = _roll(
        fleet, _package(fleet.tmp, "good", "1"), "good", "1", "mixed", cohort_by="target", canary="1", wave_size="50%"
    )
    assert summary["state"] == "completed", json.dumps(summary, indent=1)
    assert len(summary["devices"]) == 20 and summary["counts"] == {"succeeded": 20}
    assert len(summary["cohorts"]) == 6  # one per hardware class: cohorts are real
    state = rs.load_state(fleet.store, "good-1")
    for key, cohort in state["cohorts"].items():
        waves = cohort["waves"]
        assert len(waves[0]) == 1 and len(waves) >= 2, (key, waves)
        canary = state["devices"][waves[0][0]]
        for later in waves[1:]:
            for dev in later:  # nothing in a later wave was published before the canary had succeeded
                assert state["devices"][dev]["published"] >= canary["finished"]
    for dev in sim.agents:
        m = _model(sim, dev, "good")
        assert m["version"] == "1" and m["state"] == "committed"
        if sim.device_class[dev].profile.arch == "aarch64":
            assert m["provider"] == "cpu"
    stats = sim.stats()["qualification"]
    assert stats["measured"] + stats["reused"] == 20 and stats["measured"] <= 6
    progress = _retained(fleet, "edge/rollouts/good-1")  # what `fleet status` shows for rollouts
    assert progress["state"] == "completed" and progress["counts"] == {"succeeded": 20}
    for cohort in progress["cohorts"].values():
        assert cohort["waves"][0]["kind"] == "canary"
        assert sum(w["size"] for w in cohort["waves"]) == sum(w["counts"].get("succeeded", 0) for w in cohort["waves"])
    text = render_rollouts([progress], finished=True)
    some = sorted(sim.agents)[0]  # nothing to go back to: the rollback is refused for that device, with why
    back = run_rollback(
        "good", device=some, group=None, version=None, key_file=fleet.key, store=fleet.store, broker=fleet.cfg
    )
    (row,) = back["devices"]
    assert row["result"] == "skipped" and row["reason"].startswith("no version to return to")
    assert "rollout good-1: good -> 1 (completed; 20 devices" in text and "canary 0: 1 ok/0 failed" in text


def _retained(fleet, topic):
    import queue

    from agent.transport.mqtt import MqttLink

    got: queue.Queue = queue.Queue()
    link = MqttLink(fleet.cfg).start()
    try:
        link.subscribe(topic, lambda t, p, r: got.put(p), qos=1)
        return json.loads(got.get(timeout=30))
    finally:
        link.stop()


def test_accuracy_failure_halts_its_cohort_at_the_canary_only(fleet, pair, tmp_path):
    good = _roll(fleet, _package(tmp_path, "cohort", "1", cnn_model(seed=3)), "cohort", "1", "pair")
    assert good["state"] == "completed", json.dumps(good, indent=1)
    strict = _package(tmp_path, "cohort", "2", cnn_model(seed=3), STRICT_CPU)
    summary = _roll(fleet, strict, "cohort", "2", "pair", cohort_by="target", canary="1", wave_size="1")
    res = _results(summary)
    pis = sorted(d for d in res if "rpi5" in d)
    x86 = sorted(d for d in res if "amd" in d)
    assert summary["state"] == "partial"
    assert summary["cohorts"]["raspberry-pi-5"]["state"] == "halted"
    assert summary["cohorts"]["generic-x86_64"]["state"] == "completed"
    canary = pis[0]
    assert res[canary]["result"] == "failed" and "accuracy" in res[canary]["reason"], res[canary]
    for dev in pis[1:]:  # never reached: no deployment of version 2 was ever journaled there
        assert res[dev]["result"] == "not_reached"
        deps = pair.agents[dev].orchestrator.journal.all()
        assert all(d.version != "2" for d in deps if d.model == "cohort")
        assert _model(pair, dev, "cohort")["version"] == "1"
    assert _model(pair, canary, "cohort")["version"] == "1"  # the failed canary keeps serving version 1
    canary_deps = [
        (d.version, d.state.value) for d in pair.agents[canary].orchestrator.journal.all() if d.model == "cohort"
    ]
    assert canary_deps == [("1", "committed"), ("2", "failed")]  # its old desired state came back: no redeploy
    for dev in x86:
        assert res[dev]["result"] == "succeeded"
        assert _model(pair, dev, "cohort")["provider"] == "openvino"

    # Manual rollback through the CLI: one x86 device back to version 1, signed as a rollback.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "fleet",
            "rollback",
            "cohort",
            "--device",
            x86[0],
            *_signer(fleet),
            "--wait",
            str(WAIT_S),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S + 60,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    row = json.loads(out.stdout)["devices"][0]
    assert row == {"device_id": x86[0], "version": "1", "result": "rolled_back", "reason": row["reason"]}
    assert _model(pair, x86[0], "cohort")["version"] == "1"


def test_halted_rollout_rolls_back_every_device_that_took_the_version(fleet, pair, tmp_path):
    assert _roll(fleet, _package(tmp_path, "touch", "1"), "touch", "1", "pair")["state"] == "completed"
    strict = _package(tmp_path, "touch", "2", cnn_model(seed=5), STRICT_CPU)
    # No cohorts: the x86 devices sort first, so the canary (2) passes and wave 1 meets the first Pi.
    summary = _roll(fleet, strict, "touch", "2", "pair", canary="2", wave_size="2", max_failures="0%")
    res = _results(summary)
    assert summary["state"] == "halted", json.dumps(summary, indent=1)
    took = [d for d, r in res.items() if r["result"] == "rolled_back"]
    assert len(took) >= 2 and all("amd" in d for d in took)
    for dev in took:  # back on version 1, installed again from its previous slot by a signed rollback
        m = _model(pair, dev, "touch")
        assert m["version"] == "1" and m["state"] == "committed"
    failed = [d for d, r in res.items() if r["result"] == "failed"]
    assert len(failed) == 1 and "rpi5" in failed[0] and "accuracy" in res[failed[0]]["reason"]
    assert sum(r["result"] == "not_reached" for r in res.values()) == 2
    odd = {d: (r["result"], r.get("reason")) for d, r in res.items()}
    odd = {d: v for d, v in odd.items() if v[0] not in ("rolled_back", "cancelled", "failed", "not_reached")}
    assert odd == {}
    for dev in pair.agents:
        assert _model(pair, dev, "touch")["version"] == "1"


def test_control_plane_killed_mid_rollout_resumes_where_it_was(fleet, pair, tmp_path):
    pkg = _package(tmp_path, "resume", "1", cnn_model(seed=7))
    argv = [
        sys.executable,
        "-m",
        "agent",
        "fleet",
        "rollout",
        str(pkg),
        "--name",
        "resume",
        "--version",
        "1",
        "--group",
        "pair",
        "--canary",
        "1",
        "--wave-size",
        "2",
        "--deadline",
        str(WAIT_S),
        *_signer(fleet),
        "--wait",
        "--json",
    ]
    path = rs.state_path(fleet.store, "resume-1")
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # wait until the canary is out, then kill the control plane
            state = rs.load_state(fleet.store, "resume-1") if path.exists() else None
            if state and any(d["result"] == rs.IN_PROGRESS for d in state["devices"].values()):
                break
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait(30)
    killed = rs.load_state(fleet.store, "resume-1")
    assert killed["state"] == rs.RUNNING
    assert sum(d["result"] == rs.SUCCEEDED for d in killed["devices"].values()) < 6
    second = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S * 3)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming resume-1" in second.stderr
    summary = json.loads(second.stdout)
    assert summary["state"] == "completed" and summary["counts"] == {"succeeded": 6}
    for dev, agent in pair.agents.items():  # each device deployed version 1 exactly once
        deps = [d for d in agent.orchestrator.journal.all() if d.model == "resume"]
        assert len(deps) == 1 and deps[0].version == "1", (dev, [d.summary() for d in deps])
    # Running the finished rollout again (without --wait) is a no-op that reports the same summary.
    again = subprocess.run([a for a in argv if a != "--wait"], capture_output=True, text=True, timeout=WAIT_S)
    assert again.returncode == 0 and json.loads(again.stdout)["counts"] == {"succeeded": 6}, again.stderr


def test_a_device_that_stays_silent_counts_as_failed_at_the_deadline(fleet, tmp_path):
    quiet = fleet.simulator(1, "quiet", ["rpi4-4gb"], "qt")
    gone = sorted(quiet.agents)[0]
    quiet.stop_device(gone)  # graceful: its retained status now says online: false
    summary = _roll(fleet, _package(tmp_path, "quiet", "1"), "quiet", "1", "quiet", deadline_s=5)
    (row,) = summary["devices"]
    assert summary["state"] == "halted" and row["device_id"] == gone
    # The reason names the deadline and the device's last known presence (offline once its final status lands).
    assert row["result"] == "failed" and row["reason"].startswith("silent: no result within 5 s ("), row
