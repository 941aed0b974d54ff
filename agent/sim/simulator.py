"""The fleet simulator: N real DeviceAgents in one process, each with its own MQTT client, state directory and
hardware profile from a captured sysroot, qualifying what they receive for real (shared per-class cache).

The simulator owns its devices: given the control plane's store, it registers each device's own key and groups
in STORE/registry.json before the devices start (as an operator does at install), so `fleet push --wait` and
`fleet rollout --store STORE` believe their signed reports; devices whose state (and key) it made in a temporary
directory are taken out of the registry again when it stops. Given a control plane's URL instead (or as well), each
device enrolls through its API by itself and posts its signed decision records and attestations, as a daemon with
a `control_plane` section in agent.yaml does (agent.services.cpsync, the same code): with the enrollment token
when one is given (accepted at once, with the token's groups), else it waits as pending for an operator."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ConfigError
from agent.sim.classes import DeviceClass, QualificationCache, discover_sysroots, load_classes

if TYPE_CHECKING:
    from agent.transport.mqtt import BrokerConfig

__all__ = ["Simulator", "discover_sysroots"]

CP_RETRY_MAX_S = 5.0  # a simulated device asks again (enrollment, refused posts) at least this often


class Simulator:
    """Start/stop a simulated fleet. Device ids: {id_prefix}-{class}-{n}; classes assigned round-robin."""

    def __init__(
        self,
        count: int,
        *,
        broker: BrokerConfig,
        prefix: str = "edge",
        trust: list[str],
        groups: list[str],
        sysroots: list[str] | None = None,
        state_dir: str | None = None,
        id_prefix: str = "sim",
        probation_s: float = 2.0,
        latency_budget_s: float = 0.3,
        share_qualification: bool = True,
        serve_http: bool = False,
        store: str | os.PathLike[str] | None = None,
        control_plane: str | None = None,
        enroll_token: str | None = None,
        telemetry_s: float = 0.0,
        agent_release: str | None = None,
        release_fail: tuple[str, ...] = (),
    ):
        if count < 1:
            raise ConfigError("--devices: must be at least 1")
        self.count, self.broker, self.prefix, self.trust, self.groups = count, broker, prefix, trust, groups
        self.sysroots, self.id_prefix = sysroots, id_prefix  # None: every capture shipped in agent/sysroots
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="edge-sim-"))
        self.probation_s, self.latency_budget_s = probation_s, latency_budget_s
        self.serve_http = serve_http  # one OIP server per device on a free loopback port, only when asked
        self.cache = QualificationCache() if share_qualification else None
        self.classes: list[DeviceClass] = []
        self.agents: dict[str, Any] = {}
        self.device_class: dict[str, DeviceClass] = {}
        self.transitions: dict[str, int] = {}
        self._lock = threading.Lock()
        self._progress: Callable[..., None] = lambda event, **f: None
        self.store = Path(store) if store is not None else None  # whose registry.json gets the devices
        self.registered: dict[str, str] = {}  # device id -> key id this simulator registered
        self.control_plane, self.enroll_token = control_plane, enroll_token  # each device's `control_plane` section
        self.telemetry_s = telemetry_s  # health published every so many seconds (0: none, the default)
        # each device's release root laid out with this version current: it takes `kind: agent` rollouts
        # (agent.sim.release_sim); the devices of the classes or targets in release_fail fail their trials
        self.agent_release, self.release_fail = agent_release, _fail_rules(release_fail, agent_release)

    # -- life --------------------------------------------------------------------------------------------
    def start(self, progress: Callable[..., None] | None = None) -> "Simulator":
        self._progress = progress or self._progress
        if self.sysroots:
            self.classes = load_classes(self.sysroots)
        else:
            self.classes = load_classes(discover_sysroots(), strict=False)
        counters: dict[str, int] = {}
        layout = []
        for i in range(self.count):
            cls = self.classes[i % len(self.classes)]
            n = counters[cls.name] = counters.get(cls.name, 0) + 1
            layout.append((f"{self.id_prefix}-{cls.name}-{n}"[:64], cls))
        try:
            self.register([dev for dev, _ in layout])  # once for the whole fleet, before any device reports
            for dev, cls in layout:
                self.start_device(dev, cls)
            # a clustered broker (NATS: JetStream state per session and subscription) takes longer per device
            self.wait_ready(timeout=max(60.0, 1.0 * self.count))
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once every device is connected and its retained status is visible on the broker (what a
        control plane selecting devices will read); TransportError naming the missing ones otherwise."""
        from agent.errors import TransportError
        from agent.fleet.watch import FleetWatch

        deadline = time.monotonic() + timeout
        for dev, agent in list(self.agents.items()):
            link = getattr(getattr(agent, "link", None), "link", None)
            if link is not None and not link.wait_connected(max(0.1, deadline - time.monotonic())):
                raise TransportError(f"simulated device {dev} could not connect to {self.broker.redacted()}")
        # the broker gets the rest of the deadline too (NATS builds JetStream state for each new session)
        watch = FleetWatch(self.broker, self.prefix).start(timeout=max(15.0, deadline - time.monotonic()))
        try:
            while True:
                missing = [d for d in self.agents if not (watch.status.get(d) or {}).get("online")]
                if not missing:
                    return
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"{len(missing)} simulated devices have no retained status on the broker "
                        f"after {timeout:g} s (first: {missing[0]})"
                    )
                watch.drain(timeout=0.5)
        finally:
            watch.stop()

    def start_device(self, device_id: str, cls: DeviceClass) -> Any:
        """Create and start one agent (also used to bring a stopped device back)."""
        from agent.app import DeviceAgent
        from agent.config import parse_config
        from agent.lifecycle.steps import StepConfig

        if device_id not in self.registered:
            self.register([device_id])
        cfg = parse_config(self._config_dict(device_id, cls))
        steps = StepConfig(
            probation_s=self.probation_s,
            providers=list(cls.providers),
            qualify_options={"latency_budget_s": self.latency_budget_s},
        )
        qualifier = self._shared_qualifier(device_id, cls) if self.cache is not None else None
        agent = DeviceAgent(
            cfg,
            profile=cls.profile,
            sysroot=cls.sysroot,  # its health messages read the capture's sysfs (thermal, throttling), not the host's
            serve_http=self.serve_http,
            step_config=steps,
            on_event=self._on_event,
            providers=list(cls.providers),
            qualifier=qualifier,
            release=self._release(device_id, cls),
        )
        agent.start()
        with self._lock:
            self.agents[device_id], self.device_class[device_id] = agent, cls
        self._progress("device_started", device_id=device_id, target=cls.target, providers=list(cls.providers))
        return agent

    def _release(self, device_id: str, cls: DeviceClass) -> tuple[Path, Any] | None:
        """(release root, the simulator's applier) for a device, laid out with --agent-release; else None."""
        if self.agent_release is None:
            return None
        from agent.sim.release_sim import SimulatedTrial, lay_out

        root = self.state_dir / device_id / "release-root"
        lay_out(root, self.agent_release)
        rule = next((r for r in self.release_fail if r.name in (cls.name, cls.target)), None)
        return root, SimulatedTrial(rule.fails if rule is not None else lambda version: False)

    def register(self, device_ids: list[str]) -> None:
        """Make (once) each device's own key in its state directory and register its public key and the
        simulator's groups in STORE/registry.json (nothing without a store)."""
        if self.store is None or not device_ids:
            return
        from agent.artifacts.keys import device_key, public_pem
        from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry

        with DeviceRegistry.edit(self.store / REGISTRY_NAME) as registry:
            for dev in device_ids:
                entry = registry.register(dev, public_pem(device_key(self.state_dir / dev).public_key()), self.groups)
                self.registered[dev] = entry["key_id"]

    def _unregister(self) -> None:
        """Take out of the registry the devices whose keys go with the temporary state directory."""
        if self.store is None or not self.registered:
            return
        from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry

        with DeviceRegistry.edit(self.store / REGISTRY_NAME) as registry:
            for dev, kid in self.registered.items():
                registry.unregister(dev, kid)
        self.registered = {}

    def stop_device(self, device_id: str, graceful: bool = True) -> None:
        agent = self.agents.pop(device_id, None)
        if agent is not None:
            agent.stop(drain_timeout=5.0 if graceful else 0.1)

    def stop(self) -> None:
        stopping = list(self.agents.values())
        for dev in list(self.agents):
            try:
                self.stop_device(dev)
            except Exception:  # noqa: BLE001 - stop the others regardless
                pass
        for agent in stopping:  # threads left behind by a timed-out drain must end before the files go
            agent.stopped(timeout=30)
        if self._own_dir:
            self._unregister()
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pieces --------------------------------------------------------------------------------------------
    def _config_dict(self, device_id: str, cls: DeviceClass) -> dict[str, Any]:
        ends = self.broker.endpoints()  # a cluster's nodes: the device fails over from one to the next
        tls = ends[0][2]
        urls = [f"{'mqtts' if tls else 'mqtt'}://{host}:{port}" for host, port, _, _ in ends]
        mqtt: dict[str, Any] = {"url": urls if len(urls) > 1 else urls[0], "topic_prefix": self.prefix}
        if self.broker.username:
            mqtt["username"] = self.broker.username
        if self.broker.password is not None:
            pw = self.state_dir / ".broker-password"
            if not pw.exists():
                pw.write_text(self.broker.password + "\n")
                pw.chmod(0o600)
            mqtt["password_file"] = str(pw)
        if tls:
            mqtt["tls"] = {
                k: v for k, v in (("ca", self.broker.ca), ("cert", self.broker.cert), ("key", self.broker.key)) if v
            }
        doc: dict[str, Any] = {
            "device_id": device_id,
            "groups": list(self.groups),
            "state_dir": str(self.state_dir / device_id),
            "target": cls.target,
            "mqtt": mqtt,
            "trust": {"public_keys": [str(Path(t).resolve()) for t in self.trust]},
            "telemetry": {"interval_s": self.telemetry_s},
            "serving": {"host": "127.0.0.1", "port": 0},
            "downloads": {"allow_http": True},  # simulated devices on loopback pull from the bench's plain http server
        }
        if self.control_plane:
            doc["control_plane"] = self._control_plane_section()
        return doc

    def _control_plane_section(self) -> dict[str, Any]:
        """A daemon's `control_plane` section: the URL, the enrollment token in a file of the state directory (0600),
        and a short back-off ceiling, so that an operator's accept is seen within seconds."""
        section: dict[str, Any] = {"url": self.control_plane, "retry_max_s": CP_RETRY_MAX_S}
        if self.enroll_token:
            token = self.state_dir / ".enroll-token"
            if not token.exists():
                token.write_text(self.enroll_token + "\n")
                token.chmod(0o600)
            section["token_file"] = str(token)
        return section

    def _shared_qualifier(self, device_id: str, cls: DeviceClass) -> Callable[[Any, Any, Any], Any]:
        """DeviceAgent's qualifier hook: identical devices (same artifact, target, providers) share one real
        measurement. A decision is shared whatever it says (also "no provider passed"); a crash or a cancel
        raises out of measure() and is never shared: the next device measures again."""

        cache = self.cache
        assert cache is not None  # asked only where qualification is shared

        def qualifier(dep: Any, ctx: Any, measure: Callable[[], Any]) -> Any:
            key = (dep.data.get("sha256"), cls.target, cls.providers)

            def reused(first: str) -> None:
                self._progress("qualify_cache", device_id=device_id, key=f"{key[0][:12]}/{key[1]}", first=first)

            return copy.deepcopy(cache.get(key, device_id, measure, on_reuse=reused, check=ctx.check))

        return qualifier

    def _on_event(self, record: dict[str, Any]) -> None:
        if record.get("event") == "transition":
            state = str(record.get("state"))
            with self._lock:
                self.transitions[state] = self.transitions.get(state, 0) + 1

    # -- reporting -----------------------------------------------------------------------------------------
    def layout(self) -> dict[str, Any]:
        classes: dict[str, int] = {}
        for cls in self.device_class.values():
            classes[cls.name] = classes.get(cls.name, 0) + 1
        return {
            "devices": len(self.agents),
            "broker": self.broker.redacted(),
            "state_dir": str(self.state_dir),
            "classes": classes,
            "targets": {c.name: c.target for c in self.classes},
            "providers": {c.name: list(c.providers) for c in self.classes},
            "dropped": {c.name: c.why for c in self.classes},
            "http": {dev: a.url for dev, a in self.agents.items()} if self.serve_http else {},
            "control_plane": self.control_plane,  # where each device enrolls and posts (None: nowhere)
        }

    def control_plane_states(self) -> dict[str, dict[str, Any]]:
        """Each device's view of its control plane (its status document's `control_plane`: enrollment, posted,
        pending, last error); empty without one."""
        out = {}
        for dev, agent in list(self.agents.items()):
            parts = getattr(agent, "parts", None)  # built at start (agent.parts): None before
            sync = parts.cpsync if parts is not None else None
            if sync is not None:
                out[dev] = sync.snapshot()
        return out

    def stats(self) -> dict[str, Any]:
        cache = self.cache.stats() if self.cache is not None else {"measured": None, "reused": 0}
        return {"devices": len(self.agents), "qualification": cache, "transitions": dict(self.transitions)}


def _fail_rules(specs: tuple[str, ...], first: str | None) -> list[Any]:
    """`--release-fail CLASS[:K]` entries as agent.sim.release_sim.FailRule (a bad K: ConfigError)."""
    from agent.sim.release_sim import FailRule

    rules = []
    for spec in specs:
        if not spec.partition(":")[2].isdigit() and ":" in spec:
            raise ConfigError(f"--release-fail: expected CLASS or CLASS:K (K passes first), got {spec!r}")
        rules.append(FailRule(spec, first or ""))
    return rules
