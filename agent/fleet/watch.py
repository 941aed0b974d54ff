"""Fleet status from retained status topics: a watcher (live map of device documents) and the table rows."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from agent.errors import TransportError
from agent.fleet.outcome import StatusDoc
from agent.fleet.registry import NO_REGISTRY, DeviceRegistry, set_aside
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import DEFAULT_PREFIX, Topics

TERMINAL_BAD = ("failed", "rejected", "rolled_back")
UNTRUSTED_EVENT = "untrusted event"


class FleetWatch:
    """Subscribes to every device's retained status (and events); `sync()` returns once the retained
    flood has arrived (a marker published by us comes back after it: one client's packets stay in order)."""

    def __init__(
        self,
        broker: BrokerConfig,
        prefix: str = DEFAULT_PREFIX,
        events: bool = False,
        registry: DeviceRegistry | None = None,
    ) -> None:
        """registry: agent.fleet.registry.DeviceRegistry; every report is verified against it (its `trust`
        set, groups taken from it, an unverified report's claims set aside; unverified events dropped).
        Without one, every report carries trust "unverified (no device registry)" with its claims set aside
        and no groups, and every event is dropped: nothing is believed."""
        self.registry = registry
        self.topics = Topics(prefix)
        self.link = MqttLink(broker, client_id=f"edge-cp-{uuid.uuid4().hex[:12]}")
        self.status: dict[str, StatusDoc] = {}
        self.raw: dict[str, bytes] = {}  # each device's last retained status as it came (re-read on a key change)
        self.changed: set[str] = set()  # devices whose status changed since the last take_changed()
        self.verifications = 0  # statuses parsed and verified (a repeated document is neither)
        self.rollouts: dict[str, dict[str, Any]] = {}  # retained p/rollouts/{id} progress documents
        self.inbox: "queue.Queue[tuple[str, bytes]]" = queue.Queue()
        self._marker = f"{prefix}/control/{self.link.client_id}/sync"
        self._synced = threading.Event()
        self._want_events = events

    def start(self, timeout: float = 15.0) -> "FleetWatch":
        # `timeout` for each of a cluster's nodes, shared by connecting, the subscriptions and the sync, each step
        # given at least `timeout`: with the first node dead, the others close connections and refuse SUBSCRIBEs
        # for seconds while JetStream elects new leaders (NATS), and the link tries them in turn
        deadline = time.monotonic() + timeout * len(self.link.broker.endpoints())
        self.link.start(wait=deadline - time.monotonic())
        self.link.subscribe(self._marker, lambda t, p, r: self._synced.set(), qos=1)
        self.link.subscribe(self.topics.all_status(), self._enqueue, qos=1)
        self.link.subscribe(f"{self.topics.prefix}/rollouts/+", self._enqueue, qos=1)
        if self._want_events:
            self.link.subscribe(self.topics.all_events(), self._enqueue, qos=1)
        # the broker takes the subscriptions first (NATS makes a JetStream consumer for each, slowly on a busy
        # host), then the sync marker has its own `timeout` to come back behind the retained statuses
        self.link.wait_granted(max(timeout, deadline - time.monotonic()))
        self.sync(max(timeout, deadline - time.monotonic()))
        return self

    def sync(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        self._synced.clear()
        while True:
            self.link.publish(self._marker, b"sync", qos=1)
            if self._synced.wait(min(2.0, max(0.05, deadline - time.monotonic()))):
                break
            if time.monotonic() > deadline:
                raise TransportError(f"no answer from {self.link.broker.redacted()} while reading retained status")
        self.drain()

    def stop(self) -> None:
        self.link.stop()

    def __enter__(self) -> FleetWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _enqueue(self, topic: str, payload: bytes, retained: bool) -> None:
        self.inbox.put((topic, payload))

    def drain(self, timeout: float = 0.0) -> list[tuple[str, str, StatusDoc]]:
        """Apply waiting messages; returns [(kind, device, doc)] in arrival order (kind: status or events)."""
        out: list[tuple[str, str, StatusDoc]] = []
        block = timeout > 0
        while True:
            try:
                topic, payload = self.inbox.get(block, timeout) if block else self.inbox.get_nowait()
            except queue.Empty:
                return out
            block = False
            parsed = self.topics.parse(topic)
            if parsed is None or parsed.kind not in ("status", "events", "rollout"):
                continue
            if parsed.kind == "status" and parsed.device is not None:
                if self.raw.get(parsed.device) == payload and parsed.device in self.status:
                    continue  # the same document again (a resubscription, a reconnect): verified once already
                self.raw[parsed.device] = payload
                self.changed.add(parsed.device)
                self.verifications += 1
            doc = _json(payload)
            if parsed.kind == "rollout":
                assert parsed.rollout is not None  # Topics.parse: rollouts/<id> always names it
                if doc is None:
                    self.rollouts.pop(parsed.rollout, None)
                else:
                    self.rollouts[parsed.rollout] = doc
                continue
            assert parsed.device is not None  # Topics.parse: devices/<id>/status|events always names it
            if doc is not None:
                doc = self._believe(parsed.kind, parsed.device, doc)
            if parsed.kind == "status":
                if doc is None:
                    self.status.pop(parsed.device, None)  # cleared or unreadable status
                    self.raw.pop(parsed.device, None)
                    continue
                doc.setdefault("device_id", parsed.device)
                self.status[parsed.device] = doc
            if doc is not None and (parsed.kind == "status" or doc.get("trust") != UNTRUSTED_EVENT):
                out.append((parsed.kind, parsed.device, doc))

    def take_changed(self) -> dict[str, StatusDoc]:
        """{device: status} of the devices whose status changed (or was believed again) since the last call."""
        self.drain()
        changed, self.changed = self.changed, set()
        return {d: self.status[d] for d in sorted(changed) if d in self.status}

    def believe_again(self, devices: Iterable[str]) -> None:
        """Believe these devices' kept statuses again after their registry entry changed (accepted, re-keyed,
        dropped): no resubscription, no other device's status read again."""
        for device in devices:
            payload = self.raw.get(device)
            doc = _json(payload) if payload else None
            if doc is None:
                continue
            doc = self._believe("status", device, doc)
            doc.setdefault("device_id", device)
            self.status[device] = doc
            self.changed.add(device)
            self.verifications += 1

    def _believe(self, kind: str, device: str, doc: StatusDoc) -> StatusDoc:
        out = set_aside(doc, NO_REGISTRY) if self.registry is None else self.registry.apply(device, doc)
        if kind == "events" and out["trust"] != "verified":
            out["trust"] = UNTRUSTED_EVENT  # not handed on: an unverified event decides nothing
        return out


def _json(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload) if payload else None
    except (ValueError, RecursionError):  # nested past the parser (a hostile status): unreadable, like bad JSON
        return None
    return doc if isinstance(doc, dict) else None


def device_row(device_id: str, doc: StatusDoc) -> dict[str, Any]:
    """One `fleet status` row: online, models (version/provider/state), last deployment result + reason."""
    models = doc["models"] if isinstance(doc.get("models"), dict) else {}
    deployments = doc["deployments"] if isinstance(doc.get("deployments"), dict) else {}
    last = None
    for model, dep in deployments.items():
        if isinstance(dep, dict) and (last is None or (dep.get("ts") or 0) >= (last.get("ts") or 0)):
            last = dict(dep, model=model)
    return {
        "device_id": device_id,
        "online": bool(doc.get("online", False)),
        "ts": doc.get("ts"),
        "groups": doc.get("groups", []),
        "target": doc.get("target"),
        "agent_version": doc.get("agent_version"),
        "models": {
            m: {k: v.get(k) for k in ("version", "provider", "precision", "state", "sha256")}
            for m, v in models.items()
            if isinstance(v, dict)
        },
        "deployments": deployments,
        "last_deployment": last,
        "trust": doc.get("trust"),
        **({k: doc[k] for k in ("unverified_claims", "claimed_groups") if k in doc}),
    }


def fleet_status(
    broker: BrokerConfig, prefix: str = DEFAULT_PREFIX, timeout: float = 15.0, registry: DeviceRegistry | None = None
) -> dict[str, Any]:
    """{"devices": [row, ...]} sorted by device id, from the retained status topics (verified against
    `registry` when given: each row's `trust` says how far to believe it)."""
    with FleetWatch(broker, prefix, registry=registry) as watch:
        rows = [device_row(dev, doc) for dev, doc in sorted(watch.status.items())]
        rollouts = [watch.rollouts[k] for k in sorted(watch.rollouts)]
    return {"devices": rows, "count": len(rows), "online": sum(1 for r in rows if r["online"]), "rollouts": rollouts}
