"""DeviceLink and MqttLink against real brokers (Mosquitto: MQTT 5; NATS: MQTT 3.1.1)."""

import json
import queue
import time

import pytest
from brokers import free_port

from agent.errors import TransportError
from agent.transport.device import ConnectionEvent, DeviceLink, RawDesired
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import Topics

T = Topics()


def env(version: str) -> bytes:
    return json.dumps({"manifest": {"version": version}}).encode()


def next_desired(link, until=None, timeout=30.0):
    """The next desired-state message (or the first whose payload is `until`: retained messages of several
    subscriptions arrive in separate bursts, each as received; DesiredBook resolves them, verified)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ev = link.events.get(timeout=0.5)
        except queue.Empty:
            continue
        if isinstance(ev, RawDesired):
            assert ev.payload != env("9"), "got another device's desired state"
            if until is None or ev.payload == until:
                return ev
    raise AssertionError("no matching desired-state event")


def retained(cp, topic, payload):
    cp.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)


def test_offline_device_gets_latest_desired_state_on_connect(any_broker):
    cp = MqttLink(BrokerConfig(any_broker.url)).start()
    try:
        retained(cp, T.group_desired("lab", "m"), env("3"))
        retained(cp, T.group_desired("lab2", "m"), env("4"))
        retained(cp, T.device_desired("pi-9", "m"), env("9"))  # someone else's
        dev = DeviceLink(any_broker.url, "pi-1", groups=["lab", "lab2"]).start(wait=15)
        try:
            ev = next_desired(dev, until=env("4"))
            assert (ev.model, ev.payload, ev.scope) == ("m", env("4"), "group:lab2")  # each group's, as received
            retained(cp, T.device_desired("pi-1", "m"), env("2"))
            ev = next_desired(dev)
            assert (ev.payload, ev.scope) == (env("2"), "device")
            retained(cp, T.device_desired("pi-1", "m"), b"")  # withdrawn: an empty payload
            assert (lambda e: (e.payload, e.scope))(next_desired(dev)) == (b"", "device")
        finally:
            dev.stop()
        retained(cp, T.device_desired("pi-1", "m"), env("5"))  # published while the device is offline
        dev = DeviceLink(any_broker.url, "pi-1", groups=["lab", "lab2"]).start(wait=15)
        try:
            assert next_desired(dev, until=env("5")).scope == "device"
        finally:
            dev.stop()
    finally:
        cp.stop()


def test_status_is_retained_and_lwt_marks_offline(any_broker):
    cp = MqttLink(BrokerConfig(any_broker.url)).start()
    seen = queue.Queue()
    cp.subscribe(T.status("pi-1"), lambda t, p, r: seen.put(json.loads(p)))
    assert cp.wait_subscribed(30), cp.denied  # the broker holds the subscription before the device speaks
    dev = DeviceLink(any_broker.url, "pi-1", groups=["lab"]).start(wait=15)
    dev.publish_status({"models": {"m": {"version": "1", "state": "committed"}}})
    doc = seen.get(timeout=60)  # generous: NATS' MQTT gateway stores through JetStream, slow on a loaded host
    assert doc["online"] is True and doc["device_id"] == "pi-1" and doc["groups"] == ["lab"]
    dev.stop(graceful=False)  # socket dropped without DISCONNECT: the broker publishes the will
    doc = seen.get(timeout=60)
    assert doc == {"device_id": "pi-1", "online": False, "groups": ["lab"]}
    # A restarted device's will is its last status snapshot: a crash keeps its groups and models visible.
    last = {
        "device_id": "pi-1",
        "groups": ["lab"],
        "target": "raspberry-pi-5",
        "models": {"m": {"version": "1", "state": "committed"}},
        "ts": 1.0,
    }
    dev = DeviceLink(any_broker.url, "pi-1", groups=["lab"], last_status=last).start(wait=15)
    dev.stop(graceful=False)
    doc = seen.get(timeout=60)
    assert doc == {**{k: v for k, v in last.items() if k != "ts"}, "online": False}
    cp.stop()


def test_subscriptions_survive_a_broker_restart(mosquitto):
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    cp = MqttLink(BrokerConfig(mosquitto.url))
    try:
        mosquitto.restart()
        cp.start()
        retained(cp, T.device_desired("pi-1", "m"), env("7"))
        assert next_desired(dev, timeout=60).payload == env("7")
        assert dev.connected
    finally:
        dev.stop()
        cp.stop()


def test_connection_events_and_device_starts_while_broker_down(tmp_path):
    from brokers import Mosquitto

    broker = Mosquitto(tmp_path / "late", port=free_port())
    dev = DeviceLink(broker.url, "pi-1").start()  # broker not running yet: no error, keeps trying
    try:
        assert not dev.connected
        broker.start()
        deadline = time.monotonic() + 60
        while True:
            ev = dev.events.get(timeout=max(0.1, deadline - time.monotonic()))
            if isinstance(ev, ConnectionEvent) and ev.connected:
                break
    finally:
        dev.stop()
        broker.stop()


def test_refused_credentials_give_a_clear_error(tmp_path):
    from brokers import Mosquitto

    with Mosquitto(tmp_path / "auth", anonymous=False) as broker:
        with pytest.raises(TransportError, match="cannot connect"):
            MqttLink(BrokerConfig(broker.url, protocol="5")).start(wait=10)


def test_outgoing_queue_is_bounded(tmp_path):
    link = MqttLink(BrokerConfig(f"mqtt://127.0.0.1:{free_port()}"), max_queued=5).start(wait=None)
    try:
        for _ in range(5):
            link.publish("edge/x", b"1", qos=1)
        with pytest.raises(TransportError, match="queue is full"):
            link.publish("edge/x", b"1", qos=1)
    finally:
        link.stop()
