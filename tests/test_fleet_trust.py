"""The control plane believes only signed reports: devices sign status and events with their own key, the
registry (STORE/registry.json) holds their public keys and groups. A fake "committed" from an unregistered,
unsigned or badly signed device makes neither `fleet push --wait` nor a rollout wave succeed; a forged failure
neither fails a push nor halts a rollout; a claimed group the registry does not give is ignored; without a
registry, push --wait, rollout and rollback --wait refuse to run and say how to register the devices."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from support.agent import make_agent
from support.daemon import EXE, ROOT
from support.mqtt import ControlPlane, mqtt_config, register_device

from agent.errors import ConfigError
from agent.fleet.push import push
from agent.fleet.pushspec import PushSpec
from agent.fleet.registry import NO_REGISTRY, DeviceRegistry
from agent.fleet.rollout_plan import RolloutSpec
from agent.fleet.rollout_run import run_rollout
from agent.fleet.watch import fleet_status
from agent.samples import sample_tiny_package
from agent.transport.mqtt import BrokerConfig
from agent.transport.signing import sign_doc


def _fake_status(cp, device, version, groups=("lab",), state="committed", key=None):
    """A retained status in `device`'s name: committed (or failed) `version`; signed with `key` when given."""
    doc = {
        "device_id": device,
        "online": True,
        "groups": list(groups),
        "ts": time.time(),
        "models": {"tiny": {"version": version, "state": "committed", "provider": "cpu"}}
        if state == "committed"
        else {},
        "deployments": {
            "tiny": {
                "id": "x",
                "version": version,
                "state": state,
                "result": state,
                "reason": "forged",
                "ts": time.time(),
            }
        },
    }
    cp.publish(cp.topics.status(device), json.dumps(sign_doc(doc, key) if key else doc).encode())


@pytest.fixture
def cp(tmp_path, mosquitto):
    """The fleet side of the test (support.mqtt.ControlPlane) on its broker, closed after the test."""
    plane = ControlPlane(tmp_path / "cp", mosquitto)
    yield plane
    plane.close()


def _cli(*args):
    return subprocess.run(EXE + [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_without_a_registry_nothing_waits_and_status_marks_every_claim(cp, tmp_path, mosquitto):
    _fake_status(cp, "dev-1", "1")
    pkg = sample_tiny_package(tmp_path / "pkg", version="1")
    common = ["--key", cp.keyfile, "--store", cp.store_dir, "--broker", mosquitto.url]
    for argv in (
        ["fleet", "push", pkg, "--name", "tiny", "--version", "1", "--device", "dev-1", "--wait", 30],
        ["fleet", "rollout", pkg, "--name", "tiny", "--version", "1", "--all", "--wait", "--deadline", 30],
        ["fleet", "rollback", "tiny", "--device", "dev-1", "--version", "1", "--wait", 30],
        ["fleet", "rollback", "tiny", "--group", "lab", "--version", "1"],
    ):
        t0 = time.monotonic()
        out = _cli(*argv, *common)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        err = out.stderr.strip().splitlines()[-1]
        assert err.startswith("error:") and "no device registry" in err, err
        assert "edge-agent keys device" in err and "edge-agent fleet register DEVICE --public-key" in err, err
        assert f"--store {cp.store_dir}" in err, err
        assert time.monotonic() - t0 < 30  # failed fast: no wait ran out
    assert not (cp.store_dir / "rollouts").exists() or not list((cp.store_dir / "rollouts").iterdir())
    # fleet status still lists the device: its claims shown, marked, set aside; no group from its own claim
    (row,) = fleet_status(BrokerConfig(mosquitto.url))["devices"]
    assert row["trust"] == NO_REGISTRY and row["models"] == {} and row["groups"] == [], row
    assert row["unverified_claims"]["models"]["tiny"]["version"] == "1" and row["claimed_groups"] == ["lab"]
    table = _cli("fleet", "status", "--broker", mosquitto.url)
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("dev-1"))
    assert "no registry" in line and "claims: tiny 1" in line, table.stdout
    assert "no device registry" in table.stdout and "edge-agent fleet register" in table.stdout


def test_forged_committed_reports_never_make_a_rollout_wave_succeed(cp, tmp_path, mosquitto):
    # fake-a is registered but its report is signed by another key; fake-b's is unsigned; ghost is unregistered
    register_device(cp.store_dir, "fake-a", tmp_path / "a", ["fakes"])
    register_device(cp.store_dir, "fake-b", tmp_path / "b", ["fakes"])
    from agent.artifacts.keys import device_key

    _fake_status(cp, "fake-a", "1", groups=("fakes",), key=device_key(tmp_path / "not-a"))
    _fake_status(cp, "fake-b", "1", groups=("fakes",))
    _fake_status(cp, "ghost", "1", groups=("fakes",))
    spec = RolloutSpec("tiny", "1", group="fakes", canary="0", wave_size="100%", deadline_s=3).validate()
    events = []
    summary = run_rollout(
        sample_tiny_package(tmp_path / "pkg", version="1"),
        spec,
        key_file=cp.keyfile,
        store=cp.store_dir,
        broker=BrokerConfig(mosquitto.url),
        tick_s=0.2,
        progress=lambda event, **f: events.append((event, f)),
    )
    rows = {d["device_id"]: d for d in summary["devices"]}
    assert set(rows) == {"fake-a", "fake-b"}, rows  # ghost claims the group: not a member
    assert summary["state"] == "halted" and "succeeded" not in summary["counts"], summary
    assert rows["fake-a"]["result"] == "failed" and "report bad-signature: not counted" in rows["fake-a"]["reason"]
    assert rows["fake-b"]["result"] == "failed" and "report unsigned: not counted" in rows["fake-b"]["reason"]
    shown = [f for e, f in events if e == "device" and f["result"] == "in_progress"]
    assert {f["device_id"] for f in shown} == {"fake-a", "fake-b"}  # shown while the wave ran
    assert any(e == "warning" and "not in the device registry" in f["message"] for e, f in events)


def test_a_forged_failure_neither_fails_a_push_nor_halts_a_rollout(cp, tmp_path, mosquitto):
    cp.serve()
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, cp, groups=("lab",))
    register_device(cp.store_dir, "dev-1", cfg.state_dir, ["lab"])
    a = make_agent(None, config=cfg, serve_http=False, known_providers=["cpu"], start=True)
    broker = BrokerConfig(mosquitto.url)
    try:
        # an unsigned "failed" event in dev-1's own name, retained so the waiting control plane reads it
        forged = {"device_id": "dev-1", "model": "tiny", "version": "1", "state": "failed", "reason": "forged"}
        cp.publish(cp.topics.events("dev-1"), json.dumps(forged).encode())
        _fake_status(cp, "saboteur", "1", state="failed")  # unregistered, claims group lab, says it failed
        pkg = sample_tiny_package(tmp_path / "pkg1", version="1")
        doc = push(
            pkg,
            PushSpec(
                name="tiny",
                version="1",
                groups=["lab"],
                key_file=cp.keyfile,
                store=cp.store_dir,
                broker=broker,
                validate=False,
                wait=60,
            ),
        )
        assert doc["ok"] is True and set(doc["devices"]) == {"dev-1"}, doc
        _fake_status(cp, "saboteur", "2", state="failed")
        forged["version"] = "2"
        cp.publish(cp.topics.events("dev-1"), json.dumps(forged).encode())
        spec = RolloutSpec("tiny", "2", group="lab", canary="1", deadline_s=60).validate()
        summary = run_rollout(
            sample_tiny_package(tmp_path / "pkg2", version="2"),
            spec,
            key_file=cp.keyfile,
            store=cp.store_dir,
            broker=broker,
            tick_s=0.2,
        )
        assert summary["state"] == "completed" and summary["counts"] == {"succeeded": 1}, summary
        assert [d["device_id"] for d in summary["devices"]] == ["dev-1"]
    finally:
        a.stop()


def test_group_members_come_from_the_registry_and_a_silent_member_times_out(cp, tmp_path, mosquitto):
    register_device(cp.store_dir, "quiet", tmp_path / "quiet", ["lab"])  # registered, never reports
    _fake_status(cp, "claimer", "1")  # reports (unsigned) and claims group lab: not a member
    pkg = sample_tiny_package(tmp_path / "pkg", version="1")
    common = dict(name="tiny", version="1", key_file=cp.keyfile, store=cp.store_dir, validate=False, wait=3)
    doc = push(pkg, PushSpec(groups=["lab"], broker=BrokerConfig(mosquitto.url), **common))
    assert doc["ok"] is False and set(doc["devices"]) == {"quiet"}, doc
    assert doc["devices"]["quiet"]["result"] == "timeout", doc
    with pytest.raises(ConfigError, match="no device of group nobody is in the device registry"):
        push(pkg, PushSpec(groups=["nobody"], broker=BrokerConfig(mosquitto.url), **common))
    # waiting for a rollback on a device the registry does not know fails at once, like push --wait
    t0 = time.monotonic()
    out = _cli(
        *["fleet", "rollback", "tiny", "--device", "ghost", "--version", "1", "--wait", 60],
        *["--key", cp.keyfile, "--store", cp.store_dir, "--broker", mosquitto.url],
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "device ghost is not in the device registry" in out.stderr, out.stderr
    assert time.monotonic() - t0 < 60  # failed fast: the wait did not run out


def test_only_signed_reports_of_registered_devices_count(cp, tmp_path, mosquitto):
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
    a = make_agent(None, config=cfg, serve_http=False, known_providers=["cpu"], start=True)
    broker = BrokerConfig(mosquitto.url)
    try:
        pkg = sample_tiny_package(tmp_path / "pkg", version="1")
        common = dict(name="tiny", key_file=cp.keyfile, store=cp.store_dir, broker=broker, validate=False)
        # an unregistered device: waiting for it is refused at once (its reports could never count)
        _fake_status(cp, "ghost", "1")
        with pytest.raises(ConfigError, match="device ghost is not in the device registry"):
            push(pkg, PushSpec(version="1", devices=["ghost"], wait=8, **common))
        # fake committed reports of registered devices: unsigned (dev-2), signed by another key (dev-3)
        reg.register("dev-3", public_pem(device_key(tmp_path / "dev3-state").public_key()), [])
        reg.save()
        _fake_status(cp, "dev-2", "1")
        _fake_status(cp, "dev-3", "1", key=device_key(tmp_path / "not-dev3"))
        for fake, why in (("dev-2", "unsigned"), ("dev-3", "bad-signature")):
            doc = push(pkg, PushSpec(version="1", devices=[fake], wait=4, **common))
            assert doc["ok"] is False and doc["devices"][fake]["result"] == "timeout", doc
            assert f"report {why}: not counted" in doc["devices"][fake]["reason"], doc
        # a group push: the real, signed dev-1 counts; the intruder claiming group lab is not a member
        _fake_status(cp, "intruder", "2", groups=("lab",))
        # (it waits out its whole deadline: dev-2's unsigned report never counts, as it should)
        doc = push(pkg, PushSpec(version="2", groups=["lab"], wait=20, **common))
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
