"""The fleet simulator: N real DeviceAgents in one process, each with its own MQTT client, state directory and
hardware profile from a captured sysroot, qualifying what they receive for real (shared per-class cache)."""
from __future__ import annotations

import copy
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from agent.errors import ConfigError, LifecycleError
from agent.fleet.sim_classes import DeviceClass, QualificationCache, discover_sysroots, load_classes

__all__ = ["Simulator", "discover_sysroots"]
NO_PASS = "no provider passed qualification"


def _agent_class():
    from agent.app import DeviceAgent

    class SimulatedAgent(DeviceAgent):
        """A DeviceAgent whose status lists the providers its simulated hardware offers on this host."""

        sim_providers: tuple[str, ...] = ()
        sim_hook: Callable[[Any], None] | None = None

        def _providers(self) -> list[str]:
            return list(self.sim_providers)

        def _start_mqtt(self) -> None:
            if self.sim_hook is not None:
                self.sim_hook(self)  # before the first desired state can arrive
            super()._start_mqtt()

    return SimulatedAgent


class Simulator:
    """Start/stop a simulated fleet. Device ids: {id_prefix}-{class}-{n}; classes assigned round-robin."""

    def __init__(self, count: int, *, broker, prefix: str = "edge", trust: list[str], groups: list[str],
                 sysroots: list[str] | None = None, state_dir: str | None = None, id_prefix: str = "sim",
                 probation_s: float = 2.0, latency_budget_s: float = 0.3, share_qualification: bool = True,
                 serve_http: bool = False):
        if count < 1:
            raise ConfigError("--devices: must be at least 1")
        self.count, self.broker, self.prefix, self.trust, self.groups = count, broker, prefix, trust, groups
        self.sysroots, self.id_prefix = sysroots, id_prefix  # None: every capture in tests/fixtures/sysroots
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

    # -- life --------------------------------------------------------------------------------------------
    def start(self, progress: Callable[..., None] | None = None) -> "Simulator":
        self._progress = progress or self._progress
        if self.sysroots:
            self.classes = load_classes(self.sysroots)
        else:
            self.classes = load_classes(discover_sysroots(), strict=False)
        counters: dict[str, int] = {}
        try:
            for i in range(self.count):
                cls = self.classes[i % len(self.classes)]
                n = counters[cls.name] = counters.get(cls.name, 0) + 1
                self.start_device(f"{self.id_prefix}-{cls.name}-{n}"[:64], cls)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once every device is connected and its retained status is visible on the broker (what a
        control plane selecting devices will read); TransportError naming the missing ones otherwise."""
        from agent.errors import TransportError
        from agent.fleet.status import FleetWatch

        deadline = time.monotonic() + timeout
        for dev, agent in list(self.agents.items()):
            link = getattr(getattr(agent, "link", None), "link", None)
            if link is not None and not link.wait_connected(max(0.1, deadline - time.monotonic())):
                raise TransportError(f"simulated device {dev} could not connect to {self.broker.redacted()}")
        with FleetWatch(self.broker, self.prefix) as watch:
            while True:
                missing = [d for d in self.agents if not (watch.status.get(d) or {}).get("online")]
                if not missing:
                    return
                if time.monotonic() > deadline:
                    raise TransportError(f"{len(missing)} simulated devices have no retained status on the broker "
                                         f"after {timeout:g} s (first: {missing[0]})")
                watch.drain(timeout=0.5)

    def start_device(self, device_id: str, cls: DeviceClass):
        """Create and start one agent (also used to bring a stopped device back)."""
        from agent.config import parse_config
        from agent.lifecycle.steps import StepConfig

        cfg = parse_config(self._config_dict(device_id, cls))
        steps = StepConfig(probation_s=self.probation_s, providers=list(cls.providers),
                           qualify_options={"latency_budget_s": self.latency_budget_s})
        agent = _agent_class()(cfg, profile=cls.profile, serve_http=self.serve_http, step_config=steps,
                               on_event=self._on_event)
        agent.sim_providers = cls.providers
        if self.cache is not None:
            agent.sim_hook = lambda a: self._share_qualification(a, cls)
        agent.start()
        with self._lock:
            self.agents[device_id], self.device_class[device_id] = agent, cls
        self._progress("device_started", device_id=device_id, target=cls.target, providers=list(cls.providers))
        return agent

    def stop_device(self, device_id: str, graceful: bool = True) -> None:
        agent = self.agents.pop(device_id, None)
        if agent is not None:
            agent.stop(drain_timeout=5.0 if graceful else 0.1)

    def stop(self) -> None:
        for dev in list(self.agents):
            try:
                self.stop_device(dev)
            except Exception:  # noqa: BLE001 - stop the others regardless
                pass
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- pieces --------------------------------------------------------------------------------------------
    def _config_dict(self, device_id: str, cls: DeviceClass) -> dict[str, Any]:
        host, port, tls, _ = self.broker.endpoint()
        scheme = "mqtts" if tls else "mqtt"
        mqtt: dict[str, Any] = {"url": f"{scheme}://{host}:{port}", "topic_prefix": self.prefix}
        if self.broker.username:
            mqtt["username"] = self.broker.username
        if self.broker.password is not None:
            pw = self.state_dir / ".broker-password"
            if not pw.exists():
                pw.write_text(self.broker.password + "\n")
                pw.chmod(0o600)
            mqtt["password_file"] = str(pw)
        if tls:
            mqtt["tls"] = {k: v for k, v in (("ca", self.broker.ca), ("cert", self.broker.cert),
                                              ("key", self.broker.key)) if v}
        return {"device_id": device_id, "groups": list(self.groups), "state_dir": str(self.state_dir / device_id),
                "target": cls.target, "mqtt": mqtt, "trust": {"public_keys": [str(Path(t).resolve()) for t in self.trust]},
                "telemetry": {"interval_s": 0}, "serving": {"host": "127.0.0.1", "port": 0}}

    def _share_qualification(self, agent, cls: DeviceClass) -> None:
        """Wrap this agent's qualifying step with the per-process cache (same sha, target, providers)."""
        steps, device_id = agent.steps, agent.config.device_id
        measure = steps.on_qualifying

        def on_qualifying(dep, ctx):
            key = (dep.data.get("sha256"), cls.target, cls.providers)

            def compute():
                try:
                    return ("ok", measure(dep, ctx), steps.state_dir / "decisions" / f"{dep.id}.json")
                except LifecycleError as exc:
                    if NO_PASS not in str(exc):
                        raise  # a crash or a cancel is not a measurement: never shared
                    return ("fail", exc, None)

            def reused(first: str) -> None:
                self._progress("qualify_cache", device_id=device_id, key=f"{key[0][:12]}/{key[1]}", first=first)

            kind, value, record = self.cache.get(key, device_id, compute, on_reuse=reused)
            if kind == "fail":
                raise LifecycleError(f"{value} (measured once for {cls.target} on {', '.join(cls.providers)})")
            if record is not None and Path(record).exists() and Path(record).parent != steps.state_dir / "decisions":
                shutil.copyfile(record, steps.state_dir / "decisions" / f"{dep.id}.json")
            return copy.deepcopy(value)

        steps.on_qualifying = on_qualifying

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
        return {"devices": len(self.agents), "broker": self.broker.redacted(), "state_dir": str(self.state_dir),
                "classes": classes, "targets": {c.name: c.target for c in self.classes},
                "providers": {c.name: list(c.providers) for c in self.classes},
                "dropped": {c.name: c.why for c in self.classes},
                "http": {dev: a.url for dev, a in self.agents.items()} if self.serve_http else {}}

    def stats(self) -> dict[str, Any]:
        cache = self.cache.stats() if self.cache is not None else {"measured": None, "reused": 0}
        return {"devices": len(self.agents), "qualification": cache, "transitions": dict(self.transitions)}
