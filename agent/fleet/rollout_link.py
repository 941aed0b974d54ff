"""The rollout engine's view of the fleet over MQTT (retained status in, retained desired state out) and its
manifest issuer (per-device signed envelopes, byte-identical on every republish)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agent.artifacts.manifest import ArtifactFields, Manifest
from agent.transport.mqtt import BrokerConfig
from agent.transport.topics import Topics

if TYPE_CHECKING:  # pragma: no cover
    import paho.mqtt.client as paho
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agent.fleet.outcome import StatusDoc
    from agent.fleet.registry import DeviceRegistry

ManifestDoc = dict[str, Any]  # Manifest.to_dict(): what a rollout persists per version, signed per device


class FleetLink:
    """The engine's link: agent.fleet.watch.FleetWatch (live retained status) plus retained QoS 1 publishes."""

    def __init__(
        self, broker: BrokerConfig | str, prefix: str = "edge", registry: DeviceRegistry | None = None
    ) -> None:
        from agent.fleet.watch import FleetWatch

        broker = BrokerConfig(broker) if isinstance(broker, str) else broker
        self.topics = Topics(prefix)
        self.watch = FleetWatch(broker, prefix, registry=registry)
        self._infos: list[paho.MQTTMessageInfo] = []

    def __enter__(self) -> "FleetLink":
        self.watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.flush()
        finally:
            self.watch.stop()

    def statuses(self) -> dict[str, StatusDoc]:
        self.watch.drain()
        return {dev: doc for dev, doc in self.watch.status.items() if isinstance(doc, dict)}

    def wait_change(self, timeout: float) -> bool:
        return bool(self.watch.drain(timeout=timeout))

    def device_desired(self, model: str, devices: Iterable[str]) -> dict[str, str | None]:
        """The retained device-specific desired state of `model` on each device now (None: none retained)."""
        seen: dict[str, bytes] = {}
        topic_filter = f"{self.topics.prefix}/devices/+/desired/{model}"

        def keep(topic: str, payload: bytes, retained: bool) -> None:
            parsed = self.topics.parse(topic)
            if parsed is not None and parsed.device:
                seen[parsed.device] = payload

        self.watch.link.subscribe(topic_filter, keep, qos=1)
        try:
            self.watch.sync()
        finally:
            self.watch.link.unsubscribe(topic_filter)
        return {dev: (seen[dev].decode("utf-8", "replace") if seen.get(dev) else None) for dev in devices}

    def publish_desired(self, device_id: str, model: str, envelope: bytes | None) -> Any:
        """Retained desired state for one device; None clears it (group desired state applies again). Returns
        the publish's MessageInfo (wait_for_publish(), is_published(): the broker's PUBACK)."""
        topic = self.topics.device_desired(device_id, model)
        info = self.watch.link.publish(topic, envelope or b"", qos=1, retain=True)
        self._track(info)
        return info

    def publish_progress(self, rollout_id: str, doc: dict[str, Any]) -> None:
        payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        self._track(self.watch.link.publish(self.topics.rollout(rollout_id), payload, qos=1, retain=True))

    def _track(self, info: paho.MQTTMessageInfo) -> None:
        self._infos = [i for i in self._infos if not i.is_published()] + [info]

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every QoS 1 publish was acknowledged by the broker (so a restart loses nothing sent)."""
        deadline = time.monotonic() + timeout
        while any(not i.is_published() for i in self._infos):
            if time.monotonic() > deadline or not self.watch.link.connected.is_set():
                return False
            time.sleep(0.02)
        self._infos = []
        return True


class ManifestIssuer:
    """Signs per-device envelopes from the manifests persisted with the rollout (so republishes are identical:
    Ed25519 is deterministic and issued_at/expires_at are fixed at rollout creation)."""

    def __init__(self, key: Ed25519PrivateKey, manifests: dict[str, ManifestDoc]) -> None:
        self.key, self.manifests = key, manifests
        self._cache: dict[tuple[str, str, bool], bytes] = {}

    def envelope(self, device_id: str, version: str, rollback: bool) -> bytes | None:
        """None when no manifest is known for that version (its artifact was never in this store)."""
        k = (device_id, version, rollback)
        if version not in self.manifests:
            return None
        if k not in self._cache:
            base = dict(self.manifests[version])
            base.update(targeting={"devices": [device_id], "groups": []}, rollback=bool(rollback))
            self._cache[k] = Manifest.from_dict(base).sign(self.key)
        return self._cache[k]


def base_manifest(
    name: str,
    version: str,
    artifact: ArtifactFields,
    sources: list[dict[str, str]],
    ttl_s: int,
    now: float,
    qualification: dict[str, Any] | None = None,
) -> ManifestDoc:
    """The manifest dict a rollout persists (targeting is filled per device when signing)."""
    m = Manifest.for_stored(
        artifact,
        name=name,
        version=version,
        sources=sources,
        devices=["placeholder"],
        qualification=qualification,
        ttl_s=ttl_s,
        now=now,
    )
    return m.to_dict()
