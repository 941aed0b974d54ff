"""`fleet simulate --light`: thousands of devices in one process that speak the device's protocol without running
models: enrollment (signed, through the control plane's API, or registered in STORE/registry.json), signed
retained statuses, desired state verified against the trusted fleet keys, chunk pulls checked hash by hash,
a signed decision record posted, probation, then the commit reported in the status.

MQTT: a few connections for the whole fleet (`clients`), not one per device. Connection 0 subscribes to every
device's desired state and chunk answers with wildcards (devices/+/desired/+, devices/+/artifacts) and hands each
message to the device it names; each device publishes through one connection. So the broker must let one client
read and write every device's topics (no per-device ACL), as the brokers the tests and benches start do. Without
a per-device connection there is no last will: a stopped light fleet is marked offline by its own status."""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.errors import ArtifactError, ConfigError, EdgeAgentError
from agent.sim.lightdevice import ChunkCheck, LightDevice
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import Topics

if TYPE_CHECKING:
    from agent.artifacts.manifest import Manifest

PULL_TRIES, PULL_WAIT_S = 4, 5.0


@dataclass
class LightOptions:
    prefix: str = "edge"
    groups: list[str] = field(default_factory=lambda: ["sim"])
    id_prefix: str = "light"
    targets: tuple[str, ...] = ("light-a", "light-b")
    clients: int = 4  # MQTT connections for the whole fleet
    workers: int = 16  # threads that verify, pull and report
    probation_s: float = 1.0
    control_plane: str | None = None  # enroll through its API and post decision records there
    enroll_token: str | None = None
    store: str | None = None  # or register the devices in STORE/registry.json


class LightFleet:
    def __init__(self, count: int, broker: BrokerConfig, trust: list[str], opts: LightOptions | None = None):
        from agent.artifacts.keys import trusted_keys

        opts = opts or LightOptions()
        if count < 1:
            raise ConfigError("--devices: must be at least 1")
        self.broker, self.topics, self.trusted = broker, Topics(opts.prefix), trusted_keys(trust)
        if not self.trusted:
            raise ConfigError("--trust: the light devices need the fleet's public key to check desired state")
        self.control_plane, self.enroll_token, self.store = opts.control_plane, opts.enroll_token, opts.store
        self.probation_s, self.workers, self.clients = opts.probation_s, opts.workers, max(1, opts.clients)
        self.devices = self._make(count, opts.id_prefix, opts.targets, list(opts.groups))
        self.links: list[MqttLink] = []
        self.work: "queue.Queue[tuple[str, str, bytes] | None]" = queue.Queue()
        self.pulls: dict[tuple[str, str], "queue.Queue[bytes]"] = {}
        self.timers: list[tuple[float, str, str, str]] = []
        self.timer_lock, self.stop_event = threading.Condition(), threading.Event()
        self.threads: list[threading.Thread] = []
        self.counts = {"desired": 0, "pulled": 0, "committed": 0, "refused": 0, "failed": 0, "decisions": 0}
        self.progress: Callable[..., None] = lambda event, **f: None
        self.reported: dict[tuple[str, str, str], dict[str, float]] = {}  # (device, model, version): wall times

    def _make(self, count: int, id_prefix: str, targets: tuple[str, ...], groups: list[str]) -> dict[str, LightDevice]:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        out = {}
        for i in range(count):
            dev = f"{id_prefix}-{i + 1}"
            key = Ed25519PrivateKey.generate()
            out[dev] = LightDevice(dev, key, targets[i % len(targets)], groups, i % self.clients)
        return out

    # -- life --------------------------------------------------------------------------------------------
    def start(self, progress: Callable[..., None] | None = None, enroll: bool = True) -> "LightFleet":
        """enroll False: the caller ran enroll() already (a bench times it apart)."""
        self.progress = progress or self.progress
        if enroll:
            self.enroll()
        for k in range(self.clients):
            link = MqttLink(self.broker, client_id=f"edge-light-{k}-{id(self) % 100000}", max_queued=10**6)
            if k == 0:
                link.subscribe(f"{self.topics.prefix}/devices/+/desired/+", self._on_desired, qos=1)
                link.subscribe(f"{self.topics.prefix}/devices/+/artifacts", self._on_chunk, qos=1)
            self.links.append(link.start(wait=30))
        self.links[0].wait_granted(30)
        for dev in self.devices.values():
            self.publish_status(dev)
        self.threads = [
            threading.Thread(target=self._work, name=f"light-{i}", daemon=True) for i in range(self.workers)
        ]
        self.threads.append(threading.Thread(target=self._timers, name="light-timers", daemon=True))
        for t in self.threads:
            t.start()
        self.progress("light_started", devices=len(self.devices), clients=self.clients)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for _ in range(self.workers):
            self.work.put(None)
        with self.timer_lock:
            self.timer_lock.notify_all()
        for t in self.threads:
            t.join(timeout=10)
        for link in self.links:
            link.stop()

    def enroll(self) -> dict[str, int]:
        """Each device asks the control plane to enroll it (in parallel, a 429 waited out), or is registered in
        STORE/registry.json; neither: its reports stay unverified."""
        if self.control_plane:
            with ThreadPoolExecutor(8) as pool:
                states = list(pool.map(self._enroll_one, self.devices.values()))
            got = {s: states.count(s) for s in set(states)}
            self.progress("light_enrolled", **got)
            return got
        if self.store:
            from pathlib import Path

            from agent.artifacts.keys import public_pem
            from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry

            with DeviceRegistry.edit(Path(self.store) / REGISTRY_NAME) as reg:
                for d in self.devices.values():
                    reg.register(d.device_id, public_pem(d.key.public_key()), d.groups, replace=True)
            return {"registered": len(self.devices)}
        return {}

    def _enroll_one(self, dev: LightDevice) -> str:
        from agent.transport.cpclient import HttpError, enroll

        assert self.control_plane is not None
        for _ in range(60):
            try:
                got = enroll(self.control_plane, dev.device_id, dev.key, target=dev.target,
                             hardware={"simulated": "light"}, token=self.enroll_token)  # fmt: skip
                return str(got.get("state"))
            except HttpError as exc:
                if exc.code != 429:
                    raise
                time.sleep(0.5)
        raise EdgeAgentError(f"enroll {dev.device_id}: still rate limited after 60 tries")

    def publish_status(self, dev: LightDevice) -> None:
        with dev.lock:
            payload = dev.status()
        self.links[dev.client].publish(self.topics.status(dev.device_id), payload, qos=1, retain=True)

    # -- the network thread: hand on only -------------------------------------------------------------
    def _on_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        parsed = self.topics.parse(topic)
        if parsed and parsed.device in self.devices and parsed.model and payload:
            self.work.put((parsed.device, parsed.model, bytes(payload)))

    def _on_chunk(self, topic: str, payload: bytes, retained: bool) -> None:
        from agent.artifacts import chunks

        parsed = self.topics.parse(topic)
        sha = chunks.peek_sha(payload)
        box = self.pulls.get((parsed.device or "", sha or "")) if parsed else None
        if box is not None:
            box.put(bytes(payload))

    # -- workers ---------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            try:
                self._deploy(*item)
            except Exception as exc:  # noqa: BLE001 - one device's fault never stops the fleet
                self.progress("light_error", device_id=item[0], error=f"{type(exc).__name__}: {exc}")

    def _deploy(self, device_id: str, model: str, payload: bytes) -> None:
        from agent.artifacts.manifest import Manifest, ManifestRejected

        dev = self.devices[device_id]
        self.counts["desired"] += 1
        current = dev.models.get(model) or {}
        try:
            manifest = Manifest.verify(payload, self.trusted, None, device_id=device_id, groups=dev.groups)
        except ManifestRejected as exc:
            self.counts["refused"] += 1
            with dev.lock:
                dev.refuse(model, None, str(exc))
            self.publish_status(dev)
            return
        if current.get("version") == manifest.version and current.get("state") in ("committed", "probation"):
            return  # already runs it (a republished, byte-identical envelope)
        deployment_id = f"{model}-{manifest.version}-{int(time.time() * 1000)}"
        self.reported[(device_id, model, manifest.version)] = {"desired": time.time()}
        try:
            self._pull(dev, manifest)
        except EdgeAgentError as exc:
            self.counts["failed"] += 1
            with dev.lock:
                dev.failed(model, manifest.version, str(exc))
            self.publish_status(dev)
            return
        self.counts["pulled"] += 1
        self._post_decision(dev, manifest, deployment_id)
        with dev.lock:
            dev.on_probation(manifest, deployment_id, self.probation_s)
        self.publish_status(dev)
        with self.timer_lock:
            heapq.heappush(self.timers, (time.monotonic() + self.probation_s, device_id, model, manifest.version))
            self.timer_lock.notify()

    def _pull(self, dev: LightDevice, manifest: Manifest) -> None:
        """Every chunk over the chunk channel (requests to artifacts/req/DEVICE, answers on its artifacts topic),
        each checked against its hash; missing ones asked again, PULL_TRIES times."""
        from agent.artifacts import chunks

        art = manifest.artifact
        got, box = ChunkCheck(art), queue.Queue[bytes]()
        self.pulls[(dev.device_id, art.sha256)] = box
        try:
            for _ in range(PULL_TRIES):
                for at in range(0, len(got.missing()), chunks.MAX_INDICES):
                    part = got.missing()[at : at + chunks.MAX_INDICES]
                    req = chunks.encode_request(art.sha256, art.chunk_size, part)
                    self.links[dev.client].publish(self.topics.artifact_req(dev.device_id), req, qos=1)
                deadline = time.monotonic() + PULL_WAIT_S
                while not got.done() and time.monotonic() < deadline:
                    try:
                        resp = chunks.decode_response(box.get(timeout=max(0.01, deadline - time.monotonic())))
                    except queue.Empty:
                        break
                    except ArtifactError:
                        continue
                    if resp.ok:
                        got.take(resp.index, bytes(resp.body))
                if got.done():
                    got.check()
                    return
        finally:
            self.pulls.pop((dev.device_id, art.sha256), None)
        raise EdgeAgentError(f"pull of {art.sha256[:12]}: {len(got.missing())} chunks missing ({got.bad} bad)")

    def _post_decision(self, dev: LightDevice, manifest: Manifest, deployment_id: str) -> None:
        if not self.control_plane:
            return
        from agent.transport.cpclient import HttpError, post_decision

        doc = dev.decision(manifest, deployment_id)
        for _ in range(20):
            try:
                post_decision(self.control_plane, dev.device_id, doc)
                self.counts["decisions"] += 1
                return
            except HttpError as exc:
                if exc.code != 429:
                    raise
                time.sleep(0.5)

    def _timers(self) -> None:
        while not self.stop_event.is_set():
            with self.timer_lock:
                wait = self.timers[0][0] - time.monotonic() if self.timers else 1.0
                if wait > 0:
                    self.timer_lock.wait(min(wait, 1.0))
                    continue
                _, device_id, model, version = heapq.heappop(self.timers)
            dev = self.devices[device_id]
            with dev.lock:
                done = dev.commit(model, version)
            if done:
                self.counts["committed"] += 1
                self.reported.get((device_id, model, version), {})["committed"] = time.time()
                self.publish_status(dev)

    def stats(self) -> dict[str, Any]:
        return {"devices": len(self.devices), "clients": self.clients, **self.counts}
