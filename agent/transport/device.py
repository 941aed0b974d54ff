"""DeviceLink: the device's side of the protocol (desired state in, status/events/health out, chunk channel).

link = DeviceLink("mqtt://broker:1883", "pi-1", groups=["lab"])
link.start()
ev = link.events.get(timeout=1)      # RawDesired or ConnectionEvent; raises queue.Empty
link.publish_status({...})           # retained; republished on every reconnect
with link.chunk_channel(sha) as ch:  # used by artifacts.pull.ChunkPuller
    ch.request(chunk_size, [0, 1, 2]); resp = ch.get(timeout=5)
"""

from __future__ import annotations

import collections
import json
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agent.artifacts import chunks
from agent.errors import ArtifactError, TransportError
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import DEFAULT_PREFIX, Topics, check_name

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class RawDesired:
    """One retained desired-state message as received (raw mode: the consumer verifies and resolves)."""

    scope: str  # "device" or "group:<name>"
    model: str
    payload: bytes  # b"" = withdrawn
    topic: str
    kind: Literal["raw_desired"] = "raw_desired"


@dataclass(frozen=True)
class ConnectionEvent:
    connected: bool
    reason: str
    kind: Literal["connection"] = "connection"


class DesiredEvents:
    """A queue-like view (get(timeout) -> event, raises queue.Empty) of desired-state messages as received.

    Nothing is resolved here from unverified fields: a burst yields only the latest message per (scope, model),
    as RawDesired, for the consumer that verifies before it resolves (lifecycle.desired.DesiredBook, the one
    home of "device beats group")."""

    def __init__(self) -> None:
        self.raw: queue.Queue[RawDesired | ConnectionEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._out: collections.deque[RawDesired | ConnectionEvent] = collections.deque()

    def get(self, block: bool = True, timeout: float | None = None) -> RawDesired | ConnectionEvent:
        """Next event; raw messages already waiting are applied together, so a burst of retained desired
        states yields only the final winner per model."""
        with self._lock:
            if not self._out:
                left = None if timeout is None else max(0.0, timeout)
                items = [self.raw.get(block and (left is None or left > 0), left)]
                while True:
                    try:
                        items.append(self.raw.get_nowait())
                    except queue.Empty:
                        break
                self._apply(items)
                if not self._out:
                    raise queue.Empty
            return self._out.popleft()

    def _apply(self, items: list[RawDesired | ConnectionEvent]) -> None:
        latest: dict[tuple[str, str], RawDesired] = {}
        for item in items:
            if isinstance(item, ConnectionEvent):
                self._out.extend(latest.values())  # order kept around connection changes
                latest.clear()
                self._out.append(item)
                continue
            latest.pop((item.scope, item.model), None)
            latest[(item.scope, item.model)] = item
        self._out.extend(latest.values())

    def get_nowait(self) -> RawDesired | ConnectionEvent:
        return self.get(block=False)


class ChunkChannel:
    """Requests chunks of one artifact and receives its responses (bounded by what was requested)."""

    def __init__(self, link: "DeviceLink", sha256: str):
        self.link, self.sha256 = link, sha256
        self.responses: "queue.Queue[bytes]" = queue.Queue()

    def request(self, chunk_size: int, indices: Iterable[int]) -> None:
        payload = chunks.encode_request(self.sha256, chunk_size, indices)
        self.link._mqtt.publish(self.link.topics.artifact_req(self.link.device_id), payload, qos=1)

    def get(self, timeout: float) -> chunks.ChunkResponse | None:
        """The next response for this artifact, or None after `timeout`. Malformed responses are dropped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                data = self.responses.get(timeout=left)
            except queue.Empty:
                return None
            try:
                return chunks.decode_response(data)
            except ArtifactError:
                continue

    @property
    def connected(self) -> bool:
        return self.link.connected

    def close(self) -> None:
        self.link._close_channel(self)

    def __enter__(self) -> ChunkChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeviceLink:
    """The device's MQTT presence: LWT, retained status, desired-state events and the chunk channel."""

    def __init__(
        self,
        url: str | BrokerConfig,
        device_id: str,
        groups: Iterable[str] = (),
        prefix: str = DEFAULT_PREFIX,
        *,
        username: str | None = None,
        password: str | None = None,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        protocol: str = "auto",
        keepalive: int = 30,
        last_status: dict[str, Any] | None = None,
        signer: Ed25519PrivateKey | None = None,
    ) -> None:
        """Desired state arrives as RawDesired messages (verified and resolved by the consumer). signer: the device's Ed25519 key; status, events, health
        and the LWT are signed with it (transport.signing)."""
        self.signer = signer
        self.device_id = check_name(device_id, "device id")
        self.groups = tuple(check_name(g, "group") for g in groups)
        self.topics = Topics(prefix)
        broker = (
            url
            if isinstance(url, BrokerConfig)
            else BrokerConfig(
                url,
                username=username,
                password=password,
                ca=ca,
                cert=cert,
                key=key,
                protocol=protocol,
                keepalive=keepalive,
            )
        )
        self.events = DesiredEvents()
        self._channels: dict[str, ChunkChannel] = {}
        self._last_status: bytes | None = None
        will = self._will_payload(last_status)
        self._mqtt = MqttLink(
            broker,
            client_id=f"edge-dev-{self.device_id}",
            will=(self.topics.status(self.device_id), will, 1, True),
            on_connection=self._on_connection,
        )
        self._mqtt.subscribe(self.topics.device_desired_filter(self.device_id), self._on_desired, qos=1)
        for g in self.groups:
            self._mqtt.subscribe(self.topics.group_desired_filter(g), self._on_desired, qos=1)
        self._mqtt.subscribe(self.topics.artifacts(self.device_id), self._on_chunk, qos=1)

    def _will_payload(self, doc: dict[str, Any] | None) -> bytes:
        """The LWT: the last status snapshot with online=false, so a crashed device keeps its groups, target and
        models in `fleet status` (a bare stub would drop it from group rollouts)."""
        snap = dict(doc or {})
        snap.update(device_id=self.device_id, online=False)
        snap.setdefault("groups", list(self.groups))
        snap.pop("ts", None)  # the broker publishes the will later; a stale ts would mislead
        return self._encode(snap)

    def _encode(self, doc: dict[str, Any]) -> bytes:
        if self.signer is not None:
            from agent.transport.signing import sign_doc

            doc = sign_doc(doc, self.signer)
        return json.dumps(doc, sort_keys=True).encode()

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self, wait: float | None = None) -> "DeviceLink":
        """Connect in the background (a device starts even while the broker is down); wait=N blocks up to N s
        for the CONNACK and the SUBACKs of its desired and chunk topics (MqttLink.start: a pull started before
        the broker holds the chunk subscription would lose the first answers)."""
        self._mqtt.start(wait=wait)
        return self

    def stop(self, graceful: bool = True, timeout: float = 5.0) -> None:
        """graceful: publish status with online=false first; otherwise drop the socket so the LWT fires."""
        if graceful and self._mqtt.connected.is_set():
            doc = json.loads(self._last_status) if self._last_status else {"device_id": self.device_id}
            doc.update(online=False, ts=time.time())
            try:
                self._mqtt.publish(self.topics.status(self.device_id), self._encode(doc), 1, True).wait_for_publish(
                    timeout
                )
            except (TransportError, RuntimeError, ValueError):
                pass
        self._mqtt.stop(disconnect=graceful)

    @property
    def connected(self) -> bool:
        return self._mqtt.connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._mqtt.wait_connected(timeout)

    # --- outgoing -------------------------------------------------------------------------------
    def publish_status(self, doc: dict[str, Any]) -> None:
        """Retained QoS 1 status; device_id/online/ts filled in; remembered and republished on reconnect."""
        doc = dict(doc, device_id=self.device_id, online=doc.get("online", True))
        doc.setdefault("ts", time.time())
        doc.setdefault("groups", list(self.groups))
        self._last_status = self._encode(doc)
        self._publish(self.topics.status(self.device_id), self._last_status, 1, True)
        self._mqtt.set_will(self.topics.status(self.device_id), self._will_payload(doc), 1, True)

    def publish_event(self, doc: dict[str, Any]) -> None:
        doc = dict(doc, device_id=self.device_id)
        doc.setdefault("ts", time.time())
        self._publish(self.topics.events(self.device_id), self._encode(doc), 1, False)

    def publish_health(self, doc: dict[str, Any]) -> None:
        doc = dict(doc, device_id=self.device_id)
        doc.setdefault("ts", time.time())
        self._publish(self.topics.health(self.device_id), self._encode(doc), 0, True)

    def publish_attestation(self, model: str, kind: str, envelope: bytes) -> None:
        """A signed attestation (agent.evidence), retained per model and kind."""
        topic = f"{self.topics.prefix}/devices/{self.device_id}/attestations/{model}/{kind}"
        self._publish(topic, envelope, 1, True)

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        try:
            self._mqtt.publish(topic, payload, qos=qos, retain=retain)
        except TransportError:
            if qos > 0 or self.connected:
                raise  # QoS 0 while offline is dropped by design (health is periodic)

    # --- chunk channel --------------------------------------------------------------------------
    def chunk_channel(self, sha256: str) -> ChunkChannel:
        ch = ChunkChannel(self, sha256)
        channels = dict(self._channels)
        channels[sha256] = ch
        self._channels = channels
        return ch

    def _close_channel(self, ch: ChunkChannel) -> None:
        channels = dict(self._channels)
        if channels.get(ch.sha256) is ch:
            del channels[ch.sha256]
        self._channels = channels

    # --- callbacks (network thread: only enqueue) -----------------------------------------------
    def _on_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        parsed = self.topics.parse(topic)
        if parsed is None or parsed.model is None:  # the subscriptions are desired-state filters: both name a model
            return
        scope = "device" if parsed.kind == "device_desired" else f"group:{parsed.group}"
        self.events.raw.put(RawDesired(scope, parsed.model, bytes(payload or b""), topic))

    def _on_chunk(self, topic: str, payload: bytes, retained: bool) -> None:
        ch = self._channels.get(chunks.peek_sha(payload) or "")
        if ch is not None:
            ch.responses.put(payload)

    def _on_connection(self, connected: bool, reason: str) -> None:
        if connected and self._last_status is not None:
            try:
                self._mqtt.publish(self.topics.status(self.device_id), self._last_status, 1, True)
            except TransportError:
                pass  # queue full: the next publish_status carries the state
        self.events.raw.put(ConnectionEvent(connected, reason))
