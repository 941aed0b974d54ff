"""The shipped broker setup (scripts/mosquitto): passwords + ACL on a real Mosquitto, and TLS (mqtts://)."""

import json
import queue
import subprocess
import sys
from pathlib import Path

import pytest
from brokers import Mosquitto, free_port

from agent.errors import TransportError
from agent.transport.device import DeviceLink, RawDesired
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import Topics

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts" / "mosquitto"
T = Topics()


@pytest.fixture
def secured(tmp_path):
    inv = tmp_path / "inventory.txt"
    inv.write_text("pi-a lab   # a comment\npi-b prod\n")
    out = tmp_path / "edge"
    subprocess.run(
        [sys.executable, str(SCRIPTS / "provision.py"), str(inv), "--out", str(out)], check=True, capture_output=True
    )
    secrets = {p.stem: p.read_text().strip() for p in (out / "secrets").glob("*.password")}
    tls = tmp_path / "tls"
    subprocess.run(["sh", str(SCRIPTS / "make_certs.sh"), str(tls), "127.0.0.1"], check=True, capture_output=True)
    tls_port = free_port()
    # tests/brokers.py keeps Mosquitto as the user that started it (it can read pytest's private tmp dirs)
    conf = (
        f"password_file {out}/passwd\nacl_file {out}/acl\n"
        f"listener {tls_port} 127.0.0.1\ncafile {tls}/ca.crt\ncertfile {tls}/server.crt\nkeyfile {tls}/server.key\n"
    )
    with Mosquitto(tmp_path / "broker", anonymous=False, extra_conf=conf) as broker:
        yield {
            "broker": broker,
            "secrets": secrets,
            "tls_url": f"mqtts://127.0.0.1:{tls_port}",
            "ca": str(tls / "ca.crt"),
        }


def link_as(url, user, secrets, **kw):
    return MqttLink(BrokerConfig(url, username=user, password=secrets[user], **kw)).start()


def test_device_reads_only_its_own_and_its_groups_topics(secured):
    url, secrets = secured["broker"].url, secured["secrets"]
    cp = link_as(url, "controlplane", secrets)
    spy = link_as(url, "pi-a", secrets)
    got = queue.Queue()
    for f in (
        T.device_desired_filter("pi-b"),
        T.status("pi-b"),
        T.group_desired_filter("prod"),
        T.artifacts("pi-b"),
        "edge/#",
        T.device_desired_filter("pi-a"),
        T.group_desired_filter("lab"),
    ):
        spy.subscribe(f, lambda t, p, r: got.put(t))
    try:
        spy.publish("edge/control/x/sync", b"", qos=1).wait_for_publish(10)  # subscriptions are in place
        for topic in (
            T.device_desired("pi-b", "m"),
            T.status("pi-b"),
            T.group_desired("prod", "m"),
            T.artifacts("pi-b"),
            T.group_desired("lab", "m"),
            T.device_desired("pi-a", "m"),
        ):
            cp.publish(topic, b"x", qos=1).wait_for_publish(10)
        seen = set()
        while T.device_desired("pi-a", "m") not in seen:  # the last one published: delivery is in order
            seen.add(got.get(timeout=20))
        assert seen == {T.group_desired("lab", "m"), T.device_desired("pi-a", "m")}  # nothing of pi-b's
    finally:
        spy.stop()
        cp.stop()


def test_device_writes_only_its_own_status_events_health_and_requests(secured):
    url, secrets = secured["broker"].url, secured["secrets"]
    cp = link_as(url, "controlplane", secrets)
    got = queue.Queue()
    cp.subscribe("edge/#", lambda t, p, r: got.put(t))
    dev = link_as(url, "pi-a", secrets)
    try:
        cp.publish("edge/control/cp/sync", b"", qos=1).wait_for_publish(10)
        assert got.get(timeout=20) == "edge/control/cp/sync"
        forged = [
            T.status("pi-b"),
            T.events("pi-b"),
            T.device_desired("pi-a", "m"),
            T.group_desired("lab", "m"),
            T.artifact_req("pi-b"),
            T.artifacts("pi-a"),
            "edge/rollouts/r1",
        ]
        allowed = [T.status("pi-a"), T.events("pi-a"), T.health("pi-a"), T.artifact_req("pi-a")]
        for topic in forged + allowed:
            dev.publish(topic, b"{}", qos=1).wait_for_publish(10)
        seen = [got.get(timeout=20) for _ in allowed]
        assert seen == allowed
        assert got.empty()
    finally:
        dev.stop()
        cp.stop()


def test_wrong_password_is_refused(secured):
    with pytest.raises(TransportError, match="cannot connect"):
        MqttLink(BrokerConfig(secured["broker"].url, username="pi-a", password="guess")).start(wait=15)


def test_pull_and_desired_state_over_tls_with_acl(secured, tmp_path):
    from test_pull import make_artifact

    from agent.artifacts.pull import ChunkPuller
    from agent.artifacts.store import ContentStore
    from agent.fleet.artifact_server import ArtifactServer

    secrets, tls_url, ca = secured["secrets"], secured["tls_url"], secured["ca"]
    cp_store, m, data = make_artifact(tmp_path / "cp", 5 * 65536, 65536, devices=["pi-a"])
    server = ArtifactServer(
        cp_store, BrokerConfig(secured["broker"].url, username="controlplane", password=secrets["controlplane"])
    ).start()
    cp = link_as(secured["broker"].url, "controlplane", secrets)
    dev = DeviceLink(tls_url, "pi-a", groups=["lab"], username="pi-a", password=secrets["pi-a"], ca=ca).start(wait=15)
    try:
        cp.publish(
            T.group_desired("lab", "m"), json.dumps({"manifest": {"version": "1"}}).encode(), 1, True
        ).wait_for_publish(10)
        ev = dev.events.get(timeout=20)
        while not isinstance(ev, RawDesired):
            ev = dev.events.get(timeout=20)
        assert ev.scope == "group:lab"
        assert ChunkPuller(dev, ContentStore(tmp_path / "dev"), stall_timeout=30).pull(m).read_bytes() == data
    finally:
        dev.stop()
        cp.stop()
        server.stop()
    with pytest.raises(
        TransportError, match="TLS handshake failed: CERTIFICATE_VERIFY_FAILED"
    ):  # a device without the fleet CA
        DeviceLink(tls_url, "pi-a", username="pi-a", password=secrets["pi-a"]).start(wait=10)


def test_client_certificates_when_the_broker_requires_them(tmp_path):
    tls = tmp_path / "tls"
    subprocess.run(
        ["sh", str(SCRIPTS / "make_certs.sh"), str(tls), "127.0.0.1", "pi-a"], check=True, capture_output=True
    )
    assert (tls / "clients" / "pi-a.key").stat().st_mode & 0o077 == 0
    port = free_port()
    conf = (
        f"listener {port} 127.0.0.1\ncafile {tls}/ca.crt\ncertfile {tls}/server.crt\n"
        f"keyfile {tls}/server.key\nrequire_certificate true\n"
    )
    with Mosquitto(tmp_path / "broker", extra_conf=conf):
        url = f"mqtts://127.0.0.1:{port}"
        dev = DeviceLink(
            url,
            "pi-a",
            ca=str(tls / "ca.crt"),
            cert=str(tls / "clients" / "pi-a.crt"),
            key=str(tls / "clients" / "pi-a.key"),
        ).start(wait=15)
        try:
            dev.publish_status({"models": {}})
        finally:
            dev.stop()
        with pytest.raises(TransportError, match="cannot connect"):
            DeviceLink(url, "pi-a", ca=str(tls / "ca.crt")).start(wait=10)
