"""DeviceAgent: the daemon's composition root (config + hardware + target -> store, lifecycle, serving, links).
No global state: several DeviceAgents can run in one process (the fleet simulator does), each with its own
state_dir, registry, optional HTTP server (port 0 picks a free one) and optional MQTT link. Signal handlers
belong to the CLI. Test/tuning knobs come in through StepConfig; start() resolves the rest (agent.settings).
What the daemon does each loop turn lives in agent.services; this module builds the parts and wires them."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import settings
from agent.errors import EdgeAgentError
from agent.lifecycle import control
from agent.lifecycle.orchestrator import Orchestrator
from agent.lifecycle.states import State
from agent.lifecycle.status_doc import build_status, hardware_summary
from agent.lifecycle.steps import Qualifier, StepConfig, Steps
from agent.services import cpsync
from agent.services.control import ControlService
from agent.services.health import HealthPublisher, registry_health
from agent.services.inbox import InboxScanner
from agent.services.probe import ProviderProbeService
from agent.services.report import Reporter
from agent.services.status_writer import StatusWriter
from agent.serving.fronts import start_fronts
from agent.sources.inbox import InboxSource

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore
    from agent.config import AgentConfig
    from agent.hardware.profile import HardwareProfile
    from agent.serving.http.server import OIPServer
    from agent.serving.registry import ModelRegistry
    from agent.sources.mqtt import MqttSource
    from agent.targets import Target
    from agent.telemetry import Telemetry

LOOP_S = 0.5
EventSink = Callable[[dict[str, Any]], None]


class DeviceAgent:
    """Owns one device's daemon parts. start() returns once committed models serve; stop() drains and exits.

    The parts: content store, registry, lifecycle steps and orchestrator, optional MQTT source, HTTP server and
    telemetry; the services its loop ticks (agent.services: inbox, control requests, MQTT desired state,
    reported rejections, health) and those beside it (status writer, provider probe, control-plane sync)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        profile: HardwareProfile | None = None,
        sysroot: str | Path | None = None,
        serve_http: bool = True,
        step_config: StepConfig | None = None,
        on_event: EventSink | None = None,
        notifier: Any = None,
        use_lock: bool = True,
        providers: list[str] | None = None,
        qualifier: Qualifier | None = None,
    ):
        """`providers`: the providers known to be available here, in target order (skips the background probe;
        the fleet simulator passes its device class's). `qualifier`: wraps each qualification measurement
        (see lifecycle.steps.Qualifier; the simulator shares one result among identical devices)."""
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.profile, self.sysroot = profile, sysroot
        self.serve_http = serve_http
        self.step_config = step_config or StepConfig()  # what the caller chose; start() resolves the rest
        self.on_event, self.notifier, self.use_lock = on_event, notifier, use_lock
        self.target: Target | None = None
        self.store: ContentStore | None = None
        self.registry: ModelRegistry | None = None
        self.steps: Steps | None = None
        self.orchestrator: Orchestrator | None = None
        self.server: OIPServer | None = None
        self.grpc_server: Any = None  # serving.grpc.front.GRPCServer when serving.grpc_port is set
        self.link: MqttSource | None = None
        self.telemetry: Telemetry | None = None
        self.health_source: Callable[[], dict[str, Any]] | None = None  # health figures (default: telemetry's)
        self.qualifier = qualifier
        self.reporter = Reporter(self._emit, self.write_status, self._publish_event)
        self.status_writer: StatusWriter | None = None
        self.probe: ProviderProbeService | None = None
        self.health: HealthPublisher | None = None
        self.cpsync: cpsync.ControlPlaneSync | None = None  # config.control_plane: enroll, post decision records
        self._known_providers = list(providers) if providers is not None else None
        self._ticks: list[Callable[[], None]] = []  # what the loop runs each turn, in order
        self._lock: control.StateLock | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unlocked = threading.Event()  # set once the state_dir lock is really released

    # ---- life ----------------------------------------------------------------------------------
    def start(self) -> "DeviceAgent":
        from agent.lifecycle.perms import harden

        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        harden(self.state_dir)  # 0700 / 0600 whatever the umask it was created under
        if self.use_lock:
            self._lock = control.StateLock(self.state_dir).acquire()
        try:
            self._build()
            assert self.orchestrator is not None and self.registry is not None and self.probe is not None
            self.probe.start()
            starting = {"event": "starting", "state_dir": str(self.state_dir), "mode": self.config.mode}
            self._emit({**starting, "target": self._target_name()})
            if self.notifier is not None:
                self.notifier.extend_timeout(300)  # restoring big models (compiling) may take a while
            self.orchestrator.start()  # serve committed slots, then resume in-flight deployments
            if self.serve_http:
                self._start_http()
            if self.link is not None:
                self.link.start()
            if self.cpsync is not None:
                self.cpsync.start()
            self.write_status()
            self._thread = threading.Thread(target=self._loop, name=f"agent-{self.config.device_id}", daemon=True)
            self._thread.start()
        except BaseException:
            self.stop()
            raise
        if self.notifier is not None:
            self.notifier.ready(self._one_line())
        self._emit({"event": "ready", "url": self.url, "models": self.registry.models()})
        return self

    def _build(self) -> None:
        """Hardware profile and target, then store, registry, lifecycle, MQTT source, telemetry, services."""
        from agent.artifacts.store import ContentStore
        from agent.evidence.attest import Attestor
        from agent.serving.registry import ModelRegistry
        from agent.targets import detect_device, resolve

        self.profile = self.profile or detect_device(root=str(self.sysroot) if self.sysroot else "/")
        self.target = resolve(self.profile, self.config.target)
        self.step_config = settings.resolve(self.config, self.target, self.step_config)
        self.store = ContentStore(self.state_dir, file_mode=0o600)
        self.registry = ModelRegistry(finite_every=self.config.serving.finite_check_every)
        self.steps = Steps(
            self.state_dir,
            self.store,
            self.registry,
            profile=self.profile,
            target_name=self._target_name(),
            config=self.step_config,
            qualifier=self.qualifier,
            on_note=lambda name, reason: self._emit({"event": "repair", "model": name, "reason": reason}),
            attestor=Attestor(self.state_dir, self.config.device_id, publish=self._publish_attestation),
        )
        self.steps.add_source(InboxSource(self.store, self.steps.staging))
        deadlines = {State(k): float(v) for k, v in self.step_config.deadlines.items()}
        self.orchestrator = Orchestrator(
            self.state_dir, self.steps, deadlines=deadlines, listeners=[self.reporter.on_transition]
        )
        if self.config.mqtt is not None:  # the port exists before recovery: resumed downloads wait for it
            self.link = self._mqtt_source(self.orchestrator, self.steps)
            self.steps.add_source(self.link)
        self._start_telemetry()
        self._wire_services(self.orchestrator, self.steps, self.registry)

    def _publish_event(self, record: dict[str, Any]) -> None:
        """The reporter's way to the link's event topic (nothing while there is no link)."""
        if self.link is not None:
            self.link.publish_event(record)

    def _publish_attestation(self, model: str, kind: str, envelope: bytes) -> None:
        if self.link is not None:
            self.link.publish_attestation(model, kind, envelope)

    def _mqtt_source(self, orchestrator: Orchestrator, steps: Steps) -> MqttSource:
        from agent.lifecycle.intake import Intake
        from agent.sources.mqtt import MqttSource

        assert self.store is not None  # _build made it
        return MqttSource(
            self.config,
            self.state_dir,
            self.store,
            steps.slots,
            deployments=Intake(orchestrator),
            events=self,  # SourceEvents (agent.lifecycle.ports): connection() and rejected() below
            stall_s=self.step_config.stall_s,
        )

    def _wire_services(self, orchestrator: Orchestrator, steps: Steps, registry: ModelRegistry) -> None:
        """The status writer and the provider probe, then the loop's services in the order they run."""
        link = self.link
        notify = (lambda: self.notifier.status(self._one_line())) if self.notifier is not None else None
        self.status_writer = StatusWriter(
            self.state_dir,
            self.status,
            self._emit,
            publish=link.publish_status if link is not None else None,
            notify=notify,
        )
        self.probe = ProviderProbeService(
            self.state_dir,
            self.profile,
            self._target_name(),
            known=self._known_providers,
            on_probed=self.write_status,
            emit=self._emit,
        )
        writer = self.status_writer
        self.health = HealthPublisher(
            self.config.telemetry.interval_s,
            self.health_source or registry_health(registry),
            lambda: writer.disk_full,
            publish=link.publish_health if link is not None else None,
        )
        inbox = InboxScanner(self.config.inbox, orchestrator, steps.sources["inbox"], self._emit)
        control_requests = ControlService(self.state_dir, orchestrator, registry)
        self._ticks = [inbox.tick, control_requests.tick]
        if link is not None:
            self._ticks += [link.poll, self.reporter.tick]  # MQTT desired state, then the rejections it reported
        self._ticks.append(self.health.tick)
        identity = lambda: {"target": self._target_name(), "hardware": hardware_summary(self.profile)}  # noqa: E731
        self.cpsync = cpsync.for_agent(self.config, self.state_dir, identity, self.write_status, self._emit)

    def stop(self, drain_timeout: float = 10.0) -> None:
        """Stop taking work, drain in-flight HTTP requests, close sessions, publish offline, release the lock.

        The state_dir lock is released only once no thread of this agent can write there any more: a worker
        the drain timeout leaves behind (a compile that cannot be interrupted) keeps it until it ends, so a
        successor (a restarted agent in this process, a new daemon) never cleans up under a live writer."""
        self._stop.set()
        if self.notifier is not None:
            self.notifier.stopping("draining")
        if self.probe is not None:
            self.probe.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(5.0, drain_timeout))
        if self.orchestrator is not None:
            self.orchestrator.stop(timeout=drain_timeout)
        for front in (self.grpc_server, self.server):  # the inference front ends (serving.fronts)
            if front is not None:
                front.shutdown(drain_timeout)
        if self.link is not None:
            self.link.stop(graceful=True)
        if self.cpsync is not None:
            self.cpsync.stop()
        if self.registry is not None:
            self.registry.close(drain_timeout)
        if self.status_writer is not None:
            self.status_writer.close()  # nothing more is written into state_dir by this agent
        self._release_lock()

    def _release_lock(self) -> None:
        """Once no thread of this agent may still write into state_dir (workers, the loop)."""
        lock, self._lock, loop = self._lock, None, self._thread
        left = self.orchestrator.live_threads() if self.orchestrator is not None and lock is not None else []
        if lock is not None and loop is not None and loop.is_alive() and loop is not threading.current_thread():
            left.append(loop)
        if left:
            names = ", ".join(t.name for t in left)
            reason = f"{len(left)} thread(s) still finishing after the drain timeout ({names}); state_dir stays locked"
            self._emit({"event": "warning", "reason": f"{reason} until they end"})
        control.release_after(lock, left, self._unlocked, f"unlock-{self.config.device_id}")

    def stopped(self, timeout: float | None = None) -> bool:
        """Wait until stop() finished and the state_dir lock is released (threads left behind have ended)."""
        return self._unlocked.wait(timeout)

    def reload(self, new: AgentConfig) -> dict[str, Any]:
        """SIGHUP: apply what can change live (serving token, trusted keys, telemetry interval); name the rest."""
        from agent.config import changed_keys

        live, restart = changed_keys(self.config, new)
        token = new.serving.token()  # a bad token file fails here (ConfigError), before anything changed
        if self.notifier is not None:
            self.notifier.reloading()
        if self.server is not None:
            self.server.set_token(token)
        if self.link is not None and "trust.public_keys" in live:
            self.link.reload_keys(new.trust.public_keys)
        if self.health is not None:
            self.health.interval_s = new.telemetry.interval_s
        applied = sorted((live - {"groups"}) | ({"serving.token_file"} if self.server is not None else set()))
        self.config = dataclasses.replace(self.config, trust=new.trust, telemetry=new.telemetry, serving=new.serving)
        if self.notifier is not None:
            self.notifier.ready(self._one_line())
        return {"applied": applied, "needs_restart": sorted(restart | (live & {"groups"}))}

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stop() (True) or timeout (False)."""
        return self._stop.wait(timeout)

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    @property
    def disk_full(self) -> str | None:
        """Why state files cannot be written (ENOSPC), or None; reported in status and health, never fatal."""
        return self.status_writer.disk_full if self.status_writer is not None else None

    # ---- parts ---------------------------------------------------------------------------------
    def _start_http(self) -> None:  # the request memory budget follows serving.memory_max (body_budget_for)
        fronts = start_fronts(self.registry, self.config.serving, self._repository, self.step_config.memory_max)
        self.server, self.grpc_server = fronts
        if self.telemetry is not None:
            self.server.add_metrics_collector(self.telemetry.collector)

    def _repository(self, plane: Any) -> None:  # the repository extension: serving never imports the lifecycle
        if self.orchestrator is not None and self.steps is not None:
            from agent.services.repository import RepositoryService

            RepositoryService(self.state_dir, self.orchestrator, self.steps, plane).install()

    def _start_telemetry(self) -> None:
        try:
            from agent.telemetry import Telemetry, registry_stats
        except ImportError:
            return
        reg, root, device = self.registry, str(self.sysroot or "/"), self.config.device_id
        stats = lambda: registry_stats(reg)  # noqa: E731 - the figures of this agent's registry, read when asked
        self.telemetry = Telemetry(self.state_dir, profile=self.profile, root=root, stats=stats, device_id=device)
        self.health_source = self.health_source or self.telemetry.collect

    def rejected(self, record: dict[str, Any]) -> None:
        self.reporter.on_rejected(record)

    def connection(self, connected: bool, reason: str) -> None:
        self._emit({"event": "mqtt", "connected": connected, "reason": reason})
        if connected:
            assert self.orchestrator is not None and self.link is not None  # the link calls back only after _build
            self.orchestrator.source_up(self.link.kind)
            self.write_status()

    # ---- the loop: inbox, control requests, MQTT desired state, rejections, health ---------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            for tick in self._ticks:
                try:
                    tick()
                except EdgeAgentError as exc:
                    self._emit({"event": "error", "reason": str(exc)})
                except Exception as exc:  # noqa: BLE001 - the loop must survive any one bad input
                    self._emit({"event": "error", "reason": f"{type(exc).__name__}: {exc}"})
            wait = self.notifier.tick(LOOP_S) if self.notifier is not None else LOOP_S
            self._stop.wait(wait)

    # ---- reporting -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        if self.orchestrator is None or self.steps is None or self.probe is None:
            raise RuntimeError("DeviceAgent.status() before start(): no lifecycle yet")
        extra = {
            "mode": self.config.mode,
            "serving": {"url": self.url, "grpc": self.grpc_server.target if self.grpc_server is not None else None},
            "pid": os.getpid(),
            "providers_source": self.probe.source,
            "in_flight": {n: d.state.value for n, d in self.orchestrator.in_flight().items()},
            "qualification_queue": self.steps.qualify_queue.snapshot(),  # one at a time: running, waiting
        }
        extra |= {"disk_full": self.disk_full} if self.disk_full is not None else {}
        extra |= {"retrying": dict(self.reporter.retrying)} if self.reporter.retrying else {}
        extra |= {"control_plane": self.cpsync.snapshot()} if self.cpsync is not None else {}  # posted, pending
        if self.link is not None:
            extra["rejected"] = dict(self.link.rejected)  # desired states refused before the lifecycle saw them
        return build_status(
            self.state_dir,
            device_id=self.config.device_id,
            groups=self.config.groups,
            target=self._target_name(),
            hardware=hardware_summary(self.profile),
            providers=self.probe.providers(),
            registry=self.registry,
            unavailable=self.steps.unavailable,
            notes=self.steps.notes,
            extra=extra,
            stale=self.steps.stale,
            probation_s=self.step_config.window_s,
        )

    def write_status(self) -> dict[str, Any]:
        """Build the status document, write status.json (a full disk degrades) and publish it."""
        if self.status_writer is None:
            return self.status()  # before start(): raises
        return self.status_writer.write()

    def _target_name(self) -> str | None:
        return self.target.name if self.target is not None else None

    def _one_line(self) -> str:
        models = self.registry.models() if self.registry is not None else {}
        return "serving " + (", ".join(f"{n} v{v}" for n, v in sorted(models.items())) or "no models")

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"device_id": self.config.device_id, **record})
            except Exception:  # noqa: BLE001 - a broken log sink must not stop the daemon
                pass
