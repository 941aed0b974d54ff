"""paho-mqtt 2.x wrapper: broker URLs, TLS, auth, LWT, MQTT 5 with 3.1.1 fallback, replayed subscriptions.

Rules kept here (docs/field-notes.md): CallbackAPIVersion.VERSION2; callbacks only hand data to the caller's handler
(which must only enqueue); the subscription list is ours and replayed in on_connect; CONNACK is checked before
we call ourselves connected; the outgoing queue is bounded; a refused SUBACK is asked again with back-off
(a NATS node refuses while its JetStream times out); with several broker URLs (BrokerConfig) a dropped or failed
connection moves on to the next one.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.errors import TransportError
from agent.transport.broker import BrokerConfig, clean_start
from agent.transport.handshake import handshake_failure
from agent.transport.netloop import NetLoop, set_nodelay
from agent.transport.topics import filter_matches

if TYPE_CHECKING:
    import paho.mqtt.client as paho
    from paho.mqtt.client import ConnectFlags, DisconnectFlags
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    Props = Properties | None  # MQTT 5 properties; None under MQTT 3.1.1

__all__ = ["BrokerConfig", "MqttLink"]

Handler = Callable[[str, bytes, bool], None]  # (topic, payload, retained) -> None; must not block


class MqttLink:
    """One MQTT connection that survives broker restarts: subscriptions are replayed on every connect."""

    def __init__(
        self,
        broker: BrokerConfig,
        client_id: str | None = None,
        *,
        will: tuple[str, bytes, int, bool] | None = None,
        max_queued: int = 10000,
        max_inflight: int = 20,
        on_connection: Callable[[bool, str], None] | None = None,
        settle_s: float = 10.0,
    ):
        self.broker = broker
        self._endpoints = [(host, port) for host, port, _tls, _proto in broker.endpoints()]
        self._at = 0  # index of the endpoint in use; moves on at each dropped or failed connection
        self._failed_at: set[int] = set()  # endpoints that failed for good since the last CONNACK (start() gives
        self._fail_lock = threading.Lock()  # up once every one has); counted on the network thread and supervisor
        self._drops = 0  # connections the broker closed before its CONNACK, since the last CONNACK
        self._why: str | None = None  # the last definitive failure, in words
        self._awaiting = False  # start() waits for a CONNACK: only then is a hang-up diagnosed (a probe connection)
        self.host, self.port, self.tls, proto = broker.endpoint()
        self.client_id = client_id or f"edge-cp-{uuid.uuid4().hex[:12]}"
        self.will, self.max_queued, self.max_inflight = will, max_queued, max_inflight
        self.on_connection = on_connection
        self._auto = proto == 0
        self.protocol = 5 if proto in (0, 5) else 4
        self._subs: dict[str, tuple[int, Handler]] = {}
        self.connected = threading.Event()
        self.refused: str | None = None  # last CONNACK refusal
        self.denied: dict[str, str] = {}  # subscription filter -> SUBACK refusal
        self._control: "queue.Queue[str]" = queue.Queue()
        self._client: paho.Client | None = None
        self._net: NetLoop | None = None  # the client's network thread (not paho's loop_start: see netloop)
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._pending_subs: dict[int, str] = {}
        self._acked_early: set[int] = set()  # SUBACKs that arrived before subscribe() returned their mid
        self._subs_cv = threading.Condition()
        self._refusal = threading.Event()
        self._failed = threading.Event()  # a TCP/TLS connection attempt failed
        self._switching = False  # an 'auto' link is moving from MQTT 5 to 3.1.1
        self._resub_delay: dict[str, float] = {}  # filter -> seconds before asking again after a refused SUBACK
        self.settle_s = settle_s  # each granted filter is asked once more this much later (per connection)
        self._settling: set[str] = set()  # filters whose one extra SUBSCRIBE is scheduled or sent

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self, wait: float | None = 15.0) -> "MqttLink":
        """Connect in the background; with `wait`, block until CONNACK or raise TransportError, then, within the
        same `wait`, until the broker acknowledged the subscriptions made before start() (a subscriber told
        "started" must not miss what is published next; NATS builds a JetStream consumer for each). Missing
        SUBACKs are not an error here: the subscriptions are sent again at each reconnect."""
        deadline = time.monotonic() + (wait or 0.0)
        self._awaiting = wait is not None
        self._client = self._make_client()
        self._supervisor = threading.Thread(target=self._supervise, name=f"mqtt-{self.client_id}", daemon=True)
        self._supervisor.start()
        if wait is not None:
            connected, self._awaiting = self._wait_connack(wait), False
            if not connected:
                why = self.refused or self._why or self._no_connack()
                self.stop()
                raise TransportError(f"cannot connect to {self.broker.redacted()}: {why}")
            self.wait_subscribed(max(0.0, deadline - time.monotonic()))
        return self

    def _wait_connack(self, timeout: float) -> bool:
        """Wait for a successful CONNACK; give up early when the broker refused us (bad credentials, ACL)."""
        deadline = time.monotonic() + timeout
        while not self.connected.wait(0.05):
            if self._refusal.is_set() or self._failed.is_set() or time.monotonic() >= deadline:
                return self.connected.is_set()
        return True

    def wait_connected(self, timeout: float) -> bool:
        return self.connected.wait(timeout)

    def set_will(self, topic: str, payload: bytes, qos: int = 1, retain: bool = True) -> None:
        """Replace the last will; it takes effect at the next CONNECT (paho sends the will only then)."""
        self.will = (topic, payload, qos, retain)
        client = self._client
        if client is not None:
            try:
                client.will_set(topic, payload, qos=qos, retain=retain)
            except (ValueError, RuntimeError):
                pass  # the stored will is used when the client is made again

    def stop(self, disconnect: bool = True) -> None:
        """Stop the network thread; with disconnect=False the broker sees a dropped connection (LWT fires)."""
        self._stopping.set()
        self._control.put("stop")
        client = self._client
        if client is not None:
            if disconnect:
                try:
                    client.disconnect()
                except Exception:  # noqa: BLE001 - already gone
                    pass
            else:
                sock = client.socket()
                if sock is not None:
                    try:
                        sock.close()
                    except OSError:
                        pass
            if self._net is not None:
                self._net.stop()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(5)
        self.connected.clear()

    # --- subscriptions and publishing -----------------------------------------------------------
    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> None:
        subs = dict(self._subs)
        subs[topic_filter] = (qos, handler)
        self._subs = subs  # copy-on-write: callbacks read it without locks
        if self.connected.is_set() and self._client is not None:
            self._send_subscribe(self._client, topic_filter, qos)

    def unsubscribe(self, topic_filter: str) -> None:
        subs = dict(self._subs)
        subs.pop(topic_filter, None)
        self._subs = subs
        if self.connected.is_set() and self._client is not None:
            self._client.unsubscribe(topic_filter)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> paho.MQTTMessageInfo:
        """Queue a message; TransportError when the bounded outgoing queue is full. Returns paho's MessageInfo."""
        import paho.mqtt.client as mqtt

        client = self._client
        if client is None:
            raise TransportError("MQTT link is not started")
        info = client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:
            raise TransportError(f"outgoing MQTT queue is full ({self.max_queued} messages): is the broker reachable?")
        if info.rc == mqtt.MQTT_ERR_NO_CONN:
            if qos == 0:
                raise TransportError("not connected to the broker")
            # paho keeps a QoS 1/2 message and sends it after the reconnect (to the next node, failing over): it
            # is queued, not failed, so is_published()/wait_for_publish() wait for its PUBACK instead of raising
            info.rc = mqtt.MQTT_ERR_SUCCESS
        return info

    # --- internals ------------------------------------------------------------------------------
    def _make_client(self) -> paho.Client:
        import paho.mqtt.client as mqtt

        proto = mqtt.MQTTv5 if self.protocol == 5 else mqtt.MQTTv311
        clean = None if proto == mqtt.MQTTv5 else True  # MQTT 5 has clean_start (at connect) instead
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=proto, clean_session=clean)
        c.on_socket_open = set_nodelay  # small packets (requests, PUBACKs) must not wait 40 ms for Nagle
        user, pw = self.broker.credentials()
        if user is not None:
            c.username_pw_set(user, pw)
        if self.tls:
            try:
                c.tls_set(ca_certs=self.broker.ca, certfile=self.broker.cert, keyfile=self.broker.key)
            except (OSError, ValueError) as exc:
                raise TransportError(f"TLS setup failed (CA/cert/key files): {exc}") from None
        if self.will:
            topic, payload, qos, retain = self.will
            c.will_set(topic, payload, qos=qos, retain=retain)
        c.max_queued_messages_set(self.max_queued)
        c.max_inflight_messages_set(self.max_inflight)
        c.on_connect, c.on_disconnect = self._on_connect, self._on_disconnect
        c.on_message, c.on_subscribe = self._on_message, self._on_subscribe
        c.connect_async(self.host, self.port, keepalive=self.broker.keepalive, clean_start=clean_start(self.protocol))
        self._client = c  # before its thread starts: callbacks of any other (replaced) client are ignored
        self._net = NetLoop(  # back-off 1 s doubling to 10 s, reset at each CONNACK
            c,
            f"mqtt-net-{self.client_id}",
            on_connect_fail=lambda: self._on_connect_fail(c, None),
            halted=self._stopping.is_set,
            min_delay=1.0,
            max_delay=10.0,
        ).start()
        return c

    def _supervise(self) -> None:
        """Outside the callbacks: switch an 'auto' link to MQTT 3.1.1 when the broker refuses MQTT 5."""
        while not self._stopping.is_set():
            cmd = self._control.get()
            if cmd.startswith("resub:"):
                topic_filter, client = cmd[6:], self._client
                sub = self._subs.get(topic_filter)
                if sub is not None and client is not None and self.connected.is_set():
                    self._send_subscribe(client, topic_filter, sub[0])
            elif cmd.startswith("diagnose:"):
                at = int(cmd[9:])
                why = handshake_failure(self.broker, *self._endpoints[at], self.tls)
                if why is not None and not self.connected.is_set():
                    self._count_failure(at, why)
            elif cmd == "downgrade" and not self._stopping.is_set():
                old = self._client
                assert old is not None and self._net is not None  # start() made them before this thread
                self._net.stop()
                try:
                    old.disconnect()
                except Exception:  # noqa: BLE001
                    pass
                self.protocol = 4
                # the broker answered (refusing MQTT 5 only): neither a failed endpoint nor a refusal of the link
                with self._fail_lock:
                    self._failed_at, self.refused = set(), None
                self._failed.clear()
                self._client = self._make_client()
                self._switching = False

    def _send_subscribe(self, client: paho.Client, topic_filter: str, qos: int) -> None:
        rc, mid = client.subscribe(topic_filter, qos=qos)
        if mid is not None:
            with self._subs_cv:
                if mid in self._acked_early:
                    self._acked_early.discard(mid)
                else:
                    self._pending_subs[mid] = topic_filter

    def wait_subscribed(self, timeout: float = 15.0) -> bool:
        """Block until the broker acknowledged every subscription sent so far (True) or `timeout` (False).
        A subscriber that must not miss what is published next (a non-retained request, say) waits here."""
        with self._subs_cv:
            return self._subs_cv.wait_for(lambda: not self._pending_subs, timeout)

    def wait_granted(self, timeout: float = 15.0) -> bool:
        """wait_subscribed, and also until no subscription stands refused (refused ones are asked again): a
        reader of retained state (a NATS node refuses SUBSCRIBEs for a while after a peer died) waits here."""
        deadline = time.monotonic() + timeout
        while self.wait_subscribed(max(0.0, deadline - time.monotonic())) and self.denied:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return not self.denied and not self._pending_subs

    def _on_connect(
        self, client: paho.Client, userdata: object, flags: ConnectFlags, reason_code: ReasonCode, props: Props = None
    ) -> None:
        if client is not self._client:
            return  # the MQTT 5 client an 'auto' link replaced: its late events are not ours
        if reason_code.is_failure:
            self.refused = str(reason_code)
            if self._auto and self.protocol == 5 and "protocol" in str(reason_code).lower():
                self._auto = False
                self._switching = True
                self._control.put("downgrade")
            else:
                self._refusal.set()
                if self.on_connection:
                    self.on_connection(False, f"refused: {reason_code}")
            return
        self.refused = None
        with self._fail_lock:
            self._failed_at, self._drops, self._why = set(), 0, None
        self._settling = set()
        self._refusal.clear()
        self._failed.clear()
        with self._subs_cv:  # a new session: SUBACKs owed by the old one will never come
            self._pending_subs.clear()
            self._acked_early.clear()
        for topic_filter, (qos, _handler) in self._subs.items():
            self._send_subscribe(client, topic_filter, qos)
        self.connected.set()
        if self.on_connection:
            self.on_connection(True, "connected")

    def _on_connect_fail(self, client: paho.Client, userdata: object) -> None:
        if client is not self._client:
            return  # the MQTT 5 client an 'auto' link replaced: its late events are not ours
        self._count_failure(self._at, None)
        self._next_endpoint(client)

    def _count_failure(self, at: int, why: str | None) -> None:
        """Endpoint `at` failed for good (nothing listening, TLS refused); start() gives up once every one has."""
        with self._fail_lock:
            self._why = why or self._why
            self._failed_at.add(at)
            if len(self._failed_at) >= len(self._endpoints):
                self._failed.set()

    def _no_connack(self) -> str:
        why = handshake_failure(self.broker, *self._endpoints[self._at], self.tls)
        if why is None and self._drops:
            why = (
                f"no CONNACK from the broker: it closed the connection {self._drops} time(s) before answering "
                "(a cluster node whose JetStream is not ready, or a broker at its connection limit)"
            )
        return why or "no CONNACK from the broker"

    def _next_endpoint(self, client: paho.Client) -> None:
        """Failover (network thread, inside a paho callback): the next reconnect goes to the next broker URL.
        paho's loop reconnects to client.host/port after its back-off; connect_async only sets them."""
        if len(self._endpoints) < 2 or self._stopping.is_set() or self._switching:
            return
        self._at = (self._at + 1) % len(self._endpoints)
        self.host, self.port = self._endpoints[self._at]
        client.connect_async(
            self.host, self.port, keepalive=self.broker.keepalive, clean_start=clean_start(self.protocol)
        )

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: object,
        flags: DisconnectFlags,
        reason_code: ReasonCode,
        props: Props = None,
    ) -> None:
        if client is not self._client:
            return  # the MQTT 5 client an 'auto' link replaced: its late events are not ours
        was = self.connected.is_set()
        self.connected.clear()
        if not was and not self._switching:
            # dropped before a CONNACK: a TLS refusal after the handshake is final, a NATS node whose JetStream is
            # not ready (a peer just died) accepts us seconds later; a plain handshake outside paho tells which
            self._drops += 1
            if self._awaiting:  # later, a fleet reconnecting to a recovering broker would double its connections
                self._control.put(f"diagnose:{self._at}")
        if was and self.on_connection and not self._stopping.is_set():
            self.on_connection(False, f"disconnected: {reason_code}")
        self._next_endpoint(client)

    def _on_subscribe(
        self, client: paho.Client, userdata: object, mid: int, reason_codes: list[ReasonCode], props: Props = None
    ) -> None:
        with self._subs_cv:
            topic_filter = self._pending_subs.pop(mid, None)
            if topic_filter is None:
                self._acked_early.add(mid)
            self._subs_cv.notify_all()
        if topic_filter is None:
            return
        if any(rc.is_failure for rc in reason_codes):
            self.denied[topic_filter] = str(reason_codes[0])
            # a cluster node refuses while its JetStream times out (NATS after a node died): ask again later
            delay = self._resub_delay[topic_filter] = min(30.0, 2 * self._resub_delay.get(topic_filter, 0.5))
            self._settling.discard(topic_filter)  # the grant that ends these refusals is settled again
            self._ask_again(delay, topic_filter)
        else:
            self.denied.pop(topic_filter, None)
            self._resub_delay.pop(topic_filter, None)
            if topic_filter not in self._settling and self.settle_s > 0:
                # a retained message published while the broker built this subscription can reach neither it nor
                # the node's retained store in time (NATS under load or in a failover: a device that never got its
                # desired state, a watcher that never saw a status); a SUBSCRIBE resends retained messages (on
                # NATS an existing subscription's, without a JetStream request): once more per connection, later
                self._settling.add(topic_filter)
                self._ask_again(self.settle_s, topic_filter)

    def _ask_again(self, delay: float, topic_filter: str) -> None:
        timer = threading.Timer(delay, self._control.put, (f"resub:{topic_filter}",))
        timer.daemon = True
        timer.start()

    def _on_message(self, client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        payload = (
            msg.payload if isinstance(msg.payload, bytes) else bytes(msg.payload)
        )  # paho types it bytes | bytearray
        for topic_filter, (_qos, handler) in self._subs.items():
            if filter_matches(topic_filter, msg.topic):
                handler(msg.topic, payload, bool(msg.retain))
