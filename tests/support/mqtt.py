"""Helpers for MQTT-mode tests: a control plane (key, artifact store, artifact server, publisher) and envelopes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from agent.artifacts.keys import generate, load_private_key
from agent.artifacts.manifest import Manifest
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.fleet.push import store_package
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import Topics
from support.wait import wait_for

__all__ = ["ControlPlane", "manifest_of", "mqtt_config", "register_device", "wait_for"]


def manifest_of(art: dict, name: str, version: str, *, devices=("dev-1",), groups=(), **kw) -> Manifest:
    """An unsigned manifest for an artifact `store_package` stored (its sha256, size, chunks and format)."""
    kw.setdefault("recipe", None)  # as the control plane helper always built it; the delta tests pass theirs
    return Manifest.for_stored(art, name=name, version=version, devices=list(devices), groups=list(groups), **kw)


class ControlPlane:
    """The fleet side of a test: signs and publishes retained desired state, serves artifacts over MQTT."""

    def __init__(self, workdir: Path, broker, chunk_size: int = 64 * 1024):
        self.workdir, self.broker, self.chunk_size = Path(workdir), broker, chunk_size
        self.keyfile, self.pubfile, self.key_id = generate(self.workdir / "keys")
        self.key = load_private_key(self.keyfile)
        otherfile, _, _ = generate(self.workdir / "other-keys")
        self.other_key = load_private_key(otherfile)
        self.store_dir = self.workdir / "cp-store"
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.topics = Topics()
        self.server: ArtifactServer | None = None
        self.link = MqttLink(BrokerConfig(broker.url)).start(wait=15)

    def serve(self) -> ArtifactServer:
        self.server = ArtifactServer(ContentStore(self.store_dir), BrokerConfig(self.broker.url)).start()
        return self.server

    def stop_serving(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def close(self) -> None:
        self.stop_serving()
        self.link.stop()

    def manifest(self, package, name: str, version: str, *, devices=("dev-1",), groups=(), issued=None, **kw):
        art = store_package(package, self.store_dir, self.chunk_size, validate=False)
        return manifest_of(art, name, version, devices=devices, groups=groups, now=issued, **kw)

    def envelope(self, m: Manifest, *, how: str = "signed") -> bytes:
        """signed | untrusted (another key) | forged (all-zero signature) | unsigned."""
        if how == "signed":
            return m.sign(self.key)
        if how == "untrusted":
            return m.sign(self.other_key)
        env = json.loads(m.sign(self.key))
        env["signature"] = base64.b64encode(bytes(64)).decode() if how == "forged" else ""
        return json.dumps(env).encode()

    def publish(self, topic: str, payload: bytes) -> None:
        self.link.publish(topic, payload, qos=1, retain=True).wait_for_publish(15)

    def register(self, device_id: str, state_dir, groups=()) -> str:
        """Register a device with this control plane, as an operator does at install: its own public key (made
        in its state_dir by agent.artifacts.keys.device_key, which the agent then signs with) and its groups,
        in STORE/registry.json. Returns the key id."""
        return register_device(self.store_dir, device_id, state_dir, groups)

    def status_of(self, device_id: str, timeout: float = 15.0) -> dict | None:
        """The device's retained status as this control plane believes it (verified against its registry)."""
        from agent.fleet.registry import registry_for_store
        from agent.fleet.watch import FleetWatch

        watch = FleetWatch(BrokerConfig(self.broker.url), registry=registry_for_store(self.store_dir))
        with watch.start(timeout):
            return watch.status.get(device_id)

    def to_device(self, name: str, payload: bytes, device: str = "dev-1") -> None:
        self.publish(self.topics.device_desired(device, name), payload)

    def to_group(self, group: str, name: str, payload: bytes) -> None:
        self.publish(self.topics.group_desired(group, name), payload)


def register_device(store_dir, device_id: str, state_dir, groups=()) -> str:
    """Write device_id's public key (from its state_dir: agent.artifacts.keys.device_key) and groups into
    store_dir/registry.json; returns the key id."""
    from agent.artifacts.keys import device_key, public_pem
    from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry

    Path(store_dir).mkdir(parents=True, exist_ok=True)
    registry = DeviceRegistry.load(Path(store_dir) / REGISTRY_NAME)
    entry = registry.register(device_id, public_pem(device_key(state_dir).public_key()), list(groups))
    registry.save()
    return entry["key_id"]


def mqtt_config(tmp_path: Path, broker, cp: ControlPlane, groups=(), **extra):
    from agent.config import load_config
    from support.daemon import write_config

    path = write_config(
        tmp_path,
        mqtt={"url": broker.url},
        extra={"trust": {"public_keys": [str(cp.pubfile)]}, "groups": list(groups), **extra},
    )
    return load_config(path), path
