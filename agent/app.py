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

from agent.errors import EdgeAgentError
from agent.lifecycle import control
from agent.lifecycle.status_doc import build_status, hardware_summary
from agent.lifecycle.steps import Qualifier, StepConfig
from agent.parts import Parts, build
from agent.services.report import Reporter
from agent.serving.fronts import start_fronts

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore
    from agent.config import AgentConfig
    from agent.hardware.profile import HardwareProfile
    from agent.lifecycle.orchestrator import Orchestrator
    from agent.lifecycle.steps import Steps
    from agent.serving.http.server import OIPServer
    from agent.serving.registry import ModelRegistry
    from agent.sources.mqtt import MqttSource
    from agent.targets import Target
    from agent.telemetry import Telemetry

LOOP_S = 0.5
EventSink = Callable[[dict[str, Any]], None]


class DeviceAgent:
    """Owns one device's daemon parts. start() returns once committed models serve; stop() drains and exits.

    The parts (agent.parts.Parts, built once by start() and frozen): content store, registry, lifecycle steps
    and orchestrator, optional MQTT source and telemetry; the services its loop ticks (agent.services: inbox,
    control requests, MQTT desired state, reported rejections, health) and those beside it (status writer,
    provider probe, control-plane sync). The inference front ends (HTTP, gRPC) start once models serve."""

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
        release: tuple[Path, Any] | None = None,
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
        self.parts: Parts | None = None  # start() builds them once
        self.server: OIPServer | None = None
        self.grpc_server: Any = None  # serving.grpc.front.GRPCServer when serving.grpc_port is set
        self.health_source: Callable[[], dict[str, Any]] | None = None  # health figures (default: telemetry's)
        self.qualifier = qualifier
        # (release root, applier) for `kind: agent` updates (agent.services.release_update); None: the root this
        # agent runs from (<root>/releases/<version>/venv) with the real install and guard trial, if it does
        self.release = release
        self.reporter = Reporter(self.emit, self.write_status, self._publish_event)
        self._known_providers = list(providers) if providers is not None else None
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
            parts = self.parts = build(self, self.profile, self.step_config, self._known_providers)
            self.profile, self.step_config = parts.profile, parts.step_config  # detected, resolved
            parts.probe.start()
            starting = {"event": "starting", "state_dir": str(self.state_dir), "mode": self.config.mode}
            self.emit({**starting, "target": self._target_name()})
            if self.notifier is not None:
                self.notifier.extend_timeout(300)  # restoring big models (compiling) may take a while
            parts.orchestrator.start()  # serve committed slots, then resume in-flight deployments
            if self.serve_http:
                self._start_http(parts)
            if parts.link is not None:
                parts.link.start()
            if parts.cpsync is not None:
                parts.cpsync.start()
            self.write_status()
            self._thread = threading.Thread(target=self._loop, name=f"agent-{self.config.device_id}", daemon=True)
            self._thread.start()
        except BaseException:
            self.stop()
            raise
        if self.notifier is not None:
            self.notifier.ready(self.one_line())
        self.emit({"event": "ready", "url": self.url, "models": parts.registry.models()})
        return self

    def _publish_event(self, record: dict[str, Any]) -> None:
        """The reporter's way to the link's event topic (nothing while there is no link)."""
        if self.link is not None:
            self.link.publish_event(record)

    def publish_attestation(self, model: str, kind: str, envelope: bytes) -> None:
        if self.link is not None:
            self.link.publish_attestation(model, kind, envelope)

    def stop(self, drain_timeout: float = 10.0) -> None:
        """Stop taking work, drain in-flight HTTP requests, close sessions, publish offline, release the lock.

        The state_dir lock is released only once no thread of this agent can write there any more: a worker
        the drain timeout leaves behind (a compile that cannot be interrupted) keeps it until it ends, so a
        successor (a restarted agent in this process, a new daemon) never cleans up under a live writer."""
        self._stop.set()
        parts = self.parts
        if self.notifier is not None:
            self.notifier.stopping("draining")
        if parts is not None:
            parts.probe.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(5.0, drain_timeout))
        if parts is not None:
            parts.orchestrator.stop(timeout=drain_timeout)
        for front in (self.grpc_server, self.server):  # the inference front ends (serving.fronts)
            if front is not None:
                front.shutdown(drain_timeout)
        if parts is not None:
            if parts.link is not None:
                parts.link.stop(graceful=True)
            if parts.cpsync is not None:
                parts.cpsync.stop()
            parts.registry.close(drain_timeout)
            parts.status_writer.close()  # nothing more is written into state_dir by this agent
        self._release_lock()

    def _release_lock(self) -> None:
        """Once no thread of this agent may still write into state_dir (workers, the loop)."""
        lock, self._lock, loop = self._lock, None, self._thread
        left = self.parts.orchestrator.live_threads() if self.parts is not None and lock is not None else []
        if lock is not None and loop is not None and loop.is_alive() and loop is not threading.current_thread():
            left.append(loop)
        if left:
            names = ", ".join(t.name for t in left)
            reason = f"{len(left)} thread(s) still finishing after the drain timeout ({names}); state_dir stays locked"
            self.emit({"event": "warning", "reason": f"{reason} until they end"})
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
        if self.parts is not None:
            self.parts.health.interval_s = new.telemetry.interval_s
        applied = sorted((live - {"groups"}) | ({"serving.token_file"} if self.server is not None else set()))
        self.config = dataclasses.replace(self.config, trust=new.trust, telemetry=new.telemetry, serving=new.serving)
        if self.notifier is not None:
            self.notifier.ready(self.one_line())
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
        return self.parts.status_writer.disk_full if self.parts is not None else None

    # what start() built (None before): the parts tests and the CLI read
    @property
    def target(self) -> Target | None:
        return self.parts.target if self.parts is not None else None

    @property
    def store(self) -> ContentStore | None:
        return self.parts.store if self.parts is not None else None

    @property
    def registry(self) -> ModelRegistry | None:
        return self.parts.registry if self.parts is not None else None

    @property
    def steps(self) -> Steps | None:
        return self.parts.steps if self.parts is not None else None

    @property
    def orchestrator(self) -> Orchestrator | None:
        return self.parts.orchestrator if self.parts is not None else None

    @property
    def link(self) -> MqttSource | None:
        return self.parts.link if self.parts is not None else None

    @property
    def telemetry(self) -> Telemetry | None:
        return self.parts.telemetry if self.parts is not None else None

    # ---- parts ---------------------------------------------------------------------------------
    def _start_http(self, parts: Parts) -> None:  # the request memory budget follows serving.memory_max
        fronts = start_fronts(parts.registry, self.config.serving, self._repository, parts.step_config.memory_max)
        self.server, self.grpc_server = fronts
        if parts.telemetry is not None:
            self.server.add_metrics_collector(parts.telemetry.collector)

    def _repository(self, plane: Any) -> None:  # the repository extension: serving never imports the lifecycle
        if self.parts is not None:
            from agent.services.repository import RepositoryService

            RepositoryService(self.state_dir, self.parts.orchestrator, self.parts.steps, plane).install()

    def rejected(self, record: dict[str, Any]) -> None:
        self.reporter.on_rejected(record)

    def connection(self, connected: bool, reason: str) -> None:
        self.emit({"event": "mqtt", "connected": connected, "reason": reason})
        if connected:
            assert self.parts is not None and self.parts.link is not None  # the link calls back only once built
            self.parts.orchestrator.source_up(self.parts.link.kind)
            self.write_status()

    # ---- the loop: inbox, control requests, MQTT desired state, rejections, health ---------------
    def _loop(self) -> None:
        ticks = self.parts.ticks if self.parts is not None else ()
        while not self._stop.is_set():
            for tick in ticks:
                try:
                    tick()
                except EdgeAgentError as exc:
                    self.emit({"event": "error", "reason": str(exc)})
                except Exception as exc:  # noqa: BLE001 - the loop must survive any one bad input
                    self.emit({"event": "error", "reason": f"{type(exc).__name__}: {exc}"})
            wait = self.notifier.tick(LOOP_S) if self.notifier is not None else LOOP_S
            self._stop.wait(wait)

    # ---- reporting -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        parts = self.parts
        if parts is None:
            raise RuntimeError("DeviceAgent.status() before start(): no lifecycle yet")
        extra = {
            "mode": self.config.mode,
            "serving": {"url": self.url, "grpc": self.grpc_server.target if self.grpc_server is not None else None},
            "pid": os.getpid(),
            "providers_source": parts.probe.source,
            "in_flight": {n: d.state.value for n, d in parts.orchestrator.in_flight().items()},
            "qualification_queue": parts.steps.qualify_queue.snapshot(),  # one at a time: running, waiting
        }
        extra |= {"disk_full": self.disk_full} if self.disk_full is not None else {}
        extra |= {"retrying": dict(self.reporter.retrying)} if self.reporter.retrying else {}
        extra |= {"control_plane": parts.cpsync.snapshot()} if parts.cpsync is not None else {}  # posted, pending
        extra |= {"agent_release": parts.releases.section()} if parts.releases is not None else {}  # issue 40
        if parts.link is not None:
            extra["rejected"] = dict(parts.link.rejected)  # desired states refused before the lifecycle saw them
            extra["broker"] = {"connected": parts.link.link.connected}  # edge-agent-guard's trial waits for it
        return build_status(
            self.state_dir,
            device_id=self.config.device_id,
            groups=self.config.groups,
            target=parts.target.name,
            hardware=hardware_summary(parts.profile),
            providers=parts.probe.providers(),
            registry=parts.registry,
            unavailable=parts.steps.unavailable,
            notes=parts.steps.notes,
            extra=extra,
            stale=parts.steps.stale,
            probation_s=parts.step_config.window_s,
        )

    def write_status(self) -> dict[str, Any]:
        """Build the status document, write status.json (a full disk degrades) and publish it."""
        if self.parts is None:
            return self.status()  # before start(): raises
        return self.parts.status_writer.write()

    def _target_name(self) -> str | None:
        return self.target.name if self.target is not None else None

    def one_line(self) -> str:
        models = self.registry.models() if self.registry is not None else {}
        return "serving " + (", ".join(f"{n} v{v}" for n, v in sorted(models.items())) or "no models")

    def emit(self, record: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"device_id": self.config.device_id, **record})
            except Exception:  # noqa: BLE001 - a broken log sink must not stop the daemon
                pass
