"""MqttLink's network loop (agent.transport.netloop) with sockets numbered past select()'s FD_SETSIZE (1024).

paho's loop_start() waits in select.select(): a link whose socket got descriptor 1024 or more never connected and
said nothing (the fleet simulator's devices from about the 80th on). These tests hold the low descriptors open so
the link's sockets land above 1024, against a real Mosquitto."""

from __future__ import annotations

import os
import resource
import threading
import time
from contextlib import contextmanager

import pytest

from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig, MqttLink

FD_SETSIZE = 1024


@contextmanager
def low_descriptors_taken(above: int = FD_SETSIZE + 8):
    """Open /dev/null until the next descriptor is past `above`, so every socket made meanwhile is numbered
    higher; closed again afterwards. Skips where the hard limit on open files leaves no room for that."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = above + 64
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}: cannot hold {above} descriptors open")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < above:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield held[-1]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_link_whose_socket_is_past_fd_setsize_connects_and_carries_messages(mosquitto):
    got: list[bytes] = []
    arrived = threading.Event()
    with low_descriptors_taken() as highest:
        link = MqttLink(BrokerConfig(mosquitto.url), client_id="fd-high")
        link.subscribe("edge-test/fd/#", lambda t, p, r: (got.append(p), arrived.set()))
        try:
            link.start(wait=30)  # TransportError here: no CONNACK in 30 s (select() refused the socket)
            sock = link._client.socket() if link._client is not None else None
            assert sock is not None and sock.fileno() > highest >= FD_SETSIZE  # the case under test
            assert link.wait_subscribed(30)
            link.publish("edge-test/fd/x", b"over 1024", qos=1).wait_for_publish(30)
            assert arrived.wait(30) and got == [b"over 1024"]
        finally:
            link.stop()


def test_a_device_link_past_fd_setsize_publishes_its_retained_status(mosquitto):
    seen = threading.Event()
    watcher = MqttLink(BrokerConfig(mosquitto.url), client_id="fd-watch")
    watcher.subscribe("edge/devices/fd-dev/status", lambda t, p, r: seen.set() if b'"online": true' in p else None)
    watcher.start(wait=30)
    try:
        with low_descriptors_taken():
            dev = DeviceLink(mosquitto.url, "fd-dev", groups=["g"]).start(wait=30)
            try:
                assert dev.connected
                dev.publish_status({"models": {}})
                assert seen.wait(30), "the status published over a socket numbered past 1024 never arrived"
            finally:
                dev.stop()
    finally:
        watcher.stop()


def test_each_subscription_is_asked_once_more_per_connection_for_retained_messages(mosquitto):
    """A retained message published while the broker builds a subscription can miss it (seen on NATS: a device
    that never got its desired state, a watcher that never saw a status); settle_s after each grant the link
    subscribes once more (a SUBSCRIBE resends retained messages), once per connection, never in a loop."""
    seed = MqttLink(BrokerConfig(mosquitto.url), client_id="settle-seed").start(wait=30)
    seed.publish("edge-test/settle/x", b"kept", qos=1, retain=True).wait_for_publish(30)
    seed.stop()
    got: list[bytes] = []
    link = MqttLink(BrokerConfig(mosquitto.url), client_id="settle-sub", settle_s=0.5)
    link.subscribe("edge-test/settle/#", lambda t, p, r: got.append(p) if r else None)

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)  # four times settle_s: a further SUBSCRIBE would have come by now

    try:
        link.start(wait=30)
        wait_for(2)
        assert got == [b"kept"] * 2, got  # the grant, then the one settle SUBSCRIBE
        mosquitto.restart()  # persistence keeps the retained message
        wait_for(4)
        assert got == [b"kept"] * 4, got  # the reconnect's replay, and its one settle SUBSCRIBE
    finally:
        link.stop()
