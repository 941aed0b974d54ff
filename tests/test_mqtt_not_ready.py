"""A broker that accepts TCP and then closes before its CONNACK is alive but not ready (a NATS node whose JetStream
elects new leaders after a peer died: it times out loading the session and hangs up, then accepts seconds later).
MqttLink.start keeps trying it within its wait; it gives up early only on answers that will not change: nothing
listening on every node, a TLS refusal, a refused CONNACK. CI once failed `fleet status` on a 3-node NATS cluster
with its first node dead: node 0 refused, nodes 1 and 2 hung up once each, and three failures on three nodes read
as "every node is down"."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from brokers import free_port
from support.sockets import accept_each

from agent.errors import TransportError
from agent.transport.mqtt import BrokerConfig, MqttLink


class NotReadyGate:
    """A real listening socket in front of a real broker: for `closed_for` seconds it reads each client's first
    bytes (its CONNECT) and hangs up without a CONNACK; after that it relays bytes both ways to the broker."""

    def __init__(self, broker_port: int, closed_for: float):
        self.broker_port, self.open_at = broker_port, time.monotonic() + closed_for
        self.hung_up = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        accept_each(self.sock, self._stop, self._relay)

    def _relay(self, conn: socket.socket) -> None:
        if time.monotonic() < self.open_at:
            conn.settimeout(2)
            try:
                conn.recv(1024)
            except OSError:
                pass
            conn.close()
            self.hung_up += 1
            return
        upstream = socket.create_connection(("127.0.0.1", self.broker_port))
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_a_node_that_hangs_up_before_its_connack_is_tried_again_until_it_answers(mosquitto):
    dead = free_port()  # node 0: nothing listens (refused at once)
    gate = NotReadyGate(mosquitto.port, closed_for=6.0)  # node 1: alive, not ready for 6 s
    try:
        link = MqttLink(BrokerConfig(f"mqtt://127.0.0.1:{dead},mqtt://127.0.0.1:{gate.port}"))
        link.start(wait=30)
        try:
            assert link.connected.is_set() and link.port == gate.port
            assert gate.hung_up >= 1, "the gate never hung up: nothing was tested"  # one already failed the old link
        finally:
            link.stop()
    finally:
        gate.close()


def test_a_broker_that_only_hangs_up_is_named_in_the_error_when_the_wait_runs_out(mosquitto):
    gate = NotReadyGate(mosquitto.port, closed_for=3600)
    try:
        t0 = time.monotonic()
        with pytest.raises(TransportError, match=r"closed the connection \d+ time\(s\) before answering"):
            MqttLink(BrokerConfig(f"mqtt://127.0.0.1:{gate.port}")).start(wait=4)
        assert time.monotonic() - t0 < 30
        assert gate.hung_up >= 1
    finally:
        gate.close()


def test_every_node_refusing_still_ends_the_wait_early():
    ports = [free_port(), free_port()]
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="cannot connect"):
        MqttLink(BrokerConfig(",".join(f"mqtt://127.0.0.1:{p}" for p in ports))).start(wait=120)
    assert time.monotonic() - t0 < 60, "gave up only when the 120 s wait ran out"
