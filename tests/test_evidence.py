"""Signed qualification evidence: in-toto Statements in DSSE envelopes signed with the device key, verified
offline (library and CLI), refused when one byte changes or another device's key signed them."""

import json
import time

import pytest
from clirunner import edge_agent

from agent.artifacts.keys import device_key, public_pem
from agent.evidence.attest import Attestor
from agent.evidence.dsse import AttestationError
from agent.evidence.verify import verify_attestation
from agent.lifecycle.journal import Deployment
from agent.lifecycle.states import State


@pytest.fixture(scope="module")
def decision(tmp_path_factory):
    """A real qualification decision of the tiny sample model on the CPU provider (measured here)."""
    from agent.hardware import detect
    from agent.package.load import load_package
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions
    from agent.samples import sample_tiny_package
    from agent.targets import match

    profile = detect()
    pkg = load_package(sample_tiny_package(tmp_path_factory.mktemp("pkg")))
    return qualify(pkg, profile, match(profile), providers=["cpu"], options=QualifyOptions(isolate=False)).to_dict()


def deployment(state: State = State.QUALIFYING) -> Deployment:
    now = time.time()
    dep = Deployment("tiny-2-abc", "tiny", "2", state, {"kind": "manifest"}, now, now)
    dep.data.update(sha256="ab" * 32, selected={"provider": "cpu", "precision": "f32"})
    return dep


def test_qualification_attestation_verifies_offline(tmp_path, decision):
    published = []
    att = Attestor(tmp_path / "state", "dev-1", publish=lambda *a: published.append(a))
    path = att.qualification(deployment(), decision)
    pub = device_key(tmp_path / "state").public_key()
    summary = verify_attestation(path.read_bytes(), pub, device_id="dev-1")
    assert summary["kind"] == "qualification" and summary["model"] == "tiny" and summary["version"] == "2"
    assert summary["digest"]["sha256"] == "ab" * 32 and summary["selected"] == decision["selected"]
    pred = summary["statement"]["predicate"]
    row = pred["decision"]["results"][0]
    assert row["provider"] == "cpu" and "conditions" in row and row["latency_ms"]
    assert pred["decision"]["versions"] and pred["decision"]["hardware"]  # runtime versions, device profile
    assert published == [("tiny", "qualification", path.read_bytes())]

    (tmp_path / "device.pub").write_text(public_pem(pub))
    out = edge_agent("attestation", "verify", path, "--device-key", tmp_path / "device.pub", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "qualification"


def test_one_changed_byte_anywhere_is_refused(tmp_path, decision):
    att = Attestor(tmp_path / "state", "dev-1")
    data = att.qualification(deployment(), decision).read_bytes()
    pub = device_key(tmp_path / "state").public_key()
    step = max(1, len(data) // 2000)  # every byte of small files; an even spread over large ones
    for at in range(0, len(data), step):
        bad = bytearray(data)
        bad[at] ^= 0x01
        with pytest.raises(AttestationError):
            verify_attestation(bytes(bad), pub)
    bad = bytearray(data)
    bad[len(data) // 2] ^= 0x01
    (tmp_path / "bad.json").write_bytes(bytes(bad))
    (tmp_path / "device.pub").write_text(public_pem(pub))
    out = edge_agent("attestation", "verify", tmp_path / "bad.json", "--device-key", tmp_path / "device.pub")
    assert out.returncode != 0 and "error:" in out.stderr


def test_another_devices_key_is_refused(tmp_path, decision):
    path = Attestor(tmp_path / "a", "dev-1").trial(deployment(State.COMMITTED), "committed", None)
    other = device_key(tmp_path / "b").public_key()
    with pytest.raises(AttestationError, match="not by the expected device key"):
        verify_attestation(path.read_bytes(), other)
    # a device that signs with its own key but claims to be another device is refused too
    forged = Attestor(tmp_path / "b", "dev-1").trial(deployment(State.COMMITTED), "committed", None)
    assert verify_attestation(forged.read_bytes(), other)["device"] == "dev-1"
    with pytest.raises(AttestationError, match="names device"):
        verify_attestation(forged.read_bytes(), other, device_id="dev-2")


def test_fleet_lists_retained_attestations_and_refuses_a_wrong_key(mosquitto, tmp_path, decision):
    from support.mqtt import register_device

    from agent.fleet.attestations import attestation_topic, fleet_attestations
    from agent.fleet.registry import registry_for_store
    from agent.transport.mqtt import BrokerConfig, MqttLink

    register_device(tmp_path / "cp", "dev-1", tmp_path / "dev-1")
    register_device(tmp_path / "cp", "dev-2", tmp_path / "dev-2")
    good = Attestor(tmp_path / "dev-1", "dev-1").qualification(deployment(), decision).read_bytes()
    # dev-2's topic, signed by dev-1's key: refused
    stolen = Attestor(tmp_path / "dev-1", "dev-2").qualification(deployment(), decision).read_bytes()
    link = MqttLink(BrokerConfig(mosquitto.url)).start(wait=15)
    try:
        link.publish(attestation_topic("edge", "dev-1", "tiny", "qualification"), good, 1, True).wait_for_publish(15)
        link.publish(attestation_topic("edge", "dev-2", "tiny", "qualification"), stolen, 1, True).wait_for_publish(15)
    finally:
        link.stop()
    rows = fleet_attestations(BrokerConfig(mosquitto.url), registry_for_store(tmp_path / "cp"))
    by_dev = {r["device"]: r for r in rows}
    assert by_dev["dev-1"]["verified"] is True and by_dev["dev-1"]["selected"] == decision["selected"]
    assert by_dev["dev-2"]["verified"] is False and "expected device key" in by_dev["dev-2"]["reason"]
    assert [
        r["device"]
        for r in fleet_attestations(BrokerConfig(mosquitto.url), registry_for_store(tmp_path / "cp"), device="dev-2")
    ] == ["dev-2"]


def test_an_attestation_published_under_another_model_or_kind_is_refused(tmp_path, decision):
    """What `fleet attestations --model` lists must be about that model: a valid statement re-published under
    another model's or kind's topic is refused, naming both."""
    from support.mqtt import register_device

    from agent.evidence.verify import verify_many
    from agent.fleet.registry import registry_for_store

    register_device(tmp_path / "cp", "dev-1", tmp_path / "dev-1")
    data = Attestor(tmp_path / "dev-1", "dev-1").qualification(deployment(), decision).read_bytes()
    items = [("dev-1", "tiny", "qualification", data), ("dev-1", "other", "qualification", data)]
    items.append(("dev-1", "tiny", "trial", data))
    rows = verify_many(items, registry_for_store(tmp_path / "cp"))
    assert [r["verified"] for r in rows] == [True, False, False]
    assert rows[1]["reason"] == "published as the qualification of other, signed as the qualification of tiny"
    assert rows[2]["reason"] == "published as the trial of tiny, signed as the qualification of tiny"
