"""The fleet side of device attestations: read the retained {p}/devices/{id}/attestations/{model}/{kind}
messages and verify each one against that device's key in the registry (agent.evidence.verify)."""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING, Any

from agent.errors import TransportError
from agent.evidence.verify import verify_many
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import DEFAULT_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from agent.fleet.registry import DeviceRegistry


def attestation_topic(prefix: str, device: str, model: str, kind: str) -> str:
    return f"{prefix}/devices/{device}/attestations/{model}/{kind}"


def parse_topic(prefix: str, topic: str) -> tuple[str, str, str] | None:
    """(device, model, kind) of an attestation topic, else None."""
    from agent.names import is_valid_name

    parts = topic[len(prefix) + 1 :].split("/") if topic.startswith(prefix + "/") else []
    if len(parts) != 5 or parts[0] != "devices" or parts[2] != "attestations":
        return None
    device, model, kind = parts[1], parts[3], parts[4]
    return (device, model, kind) if all(is_valid_name(x) for x in (device, model, kind)) else None


def collect(
    broker: BrokerConfig, prefix: str = DEFAULT_PREFIX, timeout: float = 15.0
) -> list[tuple[str, str, str, bytes]]:
    """Every retained attestation on the broker: [(device, model, kind, envelope bytes)]."""
    got: list[tuple[str, str, str, bytes]] = []
    lock, synced = threading.Lock(), threading.Event()
    link = MqttLink(broker, client_id=f"edge-att-{uuid.uuid4().hex[:12]}")
    marker = f"{prefix}/control/{link.client_id}/sync"

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        parsed = parse_topic(prefix, topic)
        if parsed is not None:
            with lock:
                got.append((*parsed, bytes(payload)))

    link.start(wait=timeout)
    try:
        link.subscribe(marker, lambda t, p, r: synced.set(), qos=1)
        link.subscribe(f"{prefix}/devices/+/attestations/#", on_message, qos=1)
        link.wait_subscribed(timeout)
        link.publish(marker, b"sync", qos=1)  # comes back behind the retained messages
        if not synced.wait(timeout):
            raise TransportError(f"no answer from {broker.redacted()} while reading retained attestations")
    finally:
        link.stop()
    with lock:
        return list(got)


def fleet_attestations(
    broker: BrokerConfig,
    registry: DeviceRegistry,
    prefix: str = DEFAULT_PREFIX,
    device: str | None = None,
    model: str | None = None,
) -> list[dict[str, Any]]:
    """Verified rows (agent.evidence.verify.verify_many), filtered by device and model."""
    items = [i for i in collect(broker, prefix) if device in (None, i[0]) and model in (None, i[1])]
    return verify_many(sorted(items, key=lambda i: i[:3]), registry)
