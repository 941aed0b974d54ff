"""DeviceAgent: the daemon's composition root (config + hardware + target -> store, lifecycle, serving, links).

No global state: several DeviceAgents can run in one process (the fleet simulator does), each with its own
state_dir, registry, optional HTTP server (port 0 picks a free one) and optional MQTT link. Signal handlers
belong to the CLI. Test/tuning knobs come in through StepConfig (the CLI fills it from EDGE_AGENT_* variables).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import EdgeAgentError
from agent.lifecycle import control
from agent.lifecycle.orchestrator import Orchestrator
from agent.lifecycle.states import State
from agent.lifecycle.status import build_status, hardware_summary, status_path
from agent.lifecycle.steps import Qualifier, StepConfig, Steps
from agent.util.atomic import atomic_write_json

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore
    from agent.lifecycle.journal import Deployment
    from agent.lifecycle.mqttmode import MqttSource
    from agent.lifecycle.probe import ProviderProbe
    from agent.serving.registry import ModelRegistry
    from agent.serving.server import OIPServer
    from agent.telemetry import Telemetry

LOOP_S = 0.5
EventSink = Callable[[dict[str, Any]], None]


class DeviceAgent:
    """Owns one device's daemon parts. start() returns once committed models serve; stop() drains and exits."""

    def __init__(
        self,
        config,
        *,
        profile=None,
        sysroot: str | Path | None = None,
        serve_http: bool = True,
        step_config: StepConfig | None = None,
        on_event: EventSink | None = None,
        notifier=None,
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
        self.step_config = step_config or StepConfig()
        self.on_event = on_event
        self.notifier = notifier
        self.use_lock = use_lock
        self.target = None
        self.store: ContentStore | None = None
        self.registry: ModelRegistry | None = None
        self.steps: Steps | None = None
        self.orchestrator: Orchestrator | None = None
        self.server: OIPServer | None = None
        self.link: MqttSource | None = None
        self.telemetry: Telemetry | None = None
        self._lock: control.StateLock | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status_lock = threading.Lock()
        self._control_busy: set[str] = set()
        self._retrying: dict[str, dict[str, Any]] = {}  # model -> last transient failure being retried
        self.disk_full: str | None = None  # why state files cannot be written (ENOSPC); reported, never fatal
        self._status_dirty = False  # a rejection changed the status document: written once per loop turn
        self._last_health = 0.0
        self.health_source: Callable[[], dict[str, Any]] | None = None
        self._known_providers = list(providers) if providers is not None else None
        self._available: list[str] = list(providers or [])
        self._providers_source = "given" if providers is not None else "pending"
        self.qualifier = qualifier
        self._probe: ProviderProbe | None = None
        self._closed = False  # after stop(): nothing more is written into state_dir by this agent
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
            assert self.orchestrator is not None and self.registry is not None  # _build made them
            self._start_probe()
            self._emit(
                {
                    "event": "starting",
                    "state_dir": str(self.state_dir),
                    "mode": self.config.mode,
                    "target": self.target.name if self.target else None,
                }
            )
            if self.notifier is not None:
                self.notifier.extend_timeout(300)  # restoring big models (compiling) may take a while
            self.orchestrator.start()  # serve committed slots, then resume in-flight deployments
            if self.serve_http:
                self._start_http()
            if self.config.mqtt is not None:
                self._start_mqtt()
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
        """Hardware profile and target, then store, registry, lifecycle steps, orchestrator, telemetry."""
        from agent.artifacts.store import ContentStore
        from agent.serving.registry import ModelRegistry

        self.profile = self.profile or _detect(self.sysroot)
        self.target = _target(self.config.target, self.profile)
        if self.target is not None and not self.step_config.serving:
            self.step_config.serving = dict(self.target.serving or {})  # swap + swap_when_memory_short rule
        self.store = ContentStore(self.state_dir, file_mode=0o600)
        serving = self.config.serving
        if self.step_config.probation_s is None:  # EDGE_AGENT_PROBATION_S (tests) wins over the config file
            self.step_config.probation_s = serving.probation_s
        if self.step_config.build_nice is None:
            self.step_config.build_nice = serving.build_nice
        if self.step_config.memory_max is None:
            from agent.serving.memory import resolve_memory_max

            target_serving = self.target.serving if self.target is not None else None
            self.step_config.memory_max = resolve_memory_max(serving.memory_max, target_serving)[0]
        if self.step_config.probation is None:
            self.step_config.probation = serving.probation
        if self.step_config.shadow is None:
            self.step_config.shadow = serving.shadow
        self.registry = ModelRegistry(finite_every=serving.finite_check_every)
        self.steps = Steps(
            self.state_dir,
            self.store,
            self.registry,
            profile=self.profile,
            target_name=self.target.name if self.target else None,
            config=self.step_config,
        )
        self.steps.qualifier = self.qualifier
        self.steps.on_note = lambda name, reason: self._emit({"event": "repair", "model": name, "reason": reason})
        deadlines = {State(k): float(v) for k, v in self.step_config.deadlines.items()}
        self.orchestrator = Orchestrator(
            self.state_dir, self.steps, deadlines=deadlines, listeners=[self._on_transition]
        )
        if self.config.mqtt is not None:  # the port exists before recovery: resumed downloads wait for it
            from agent.lifecycle.mqttmode import MqttSource

            self.link = MqttSource(
                self.config,
                self.state_dir,
                self.store,
                self.steps.slots,
                submit=self.orchestrator.submit,
                seen=self.orchestrator.seen,
                in_flight=self.orchestrator.in_flight,
                cancel=self.orchestrator.cancel,
                on_connection=self._on_connection,
                on_rejected=self._on_rejected,
                stall_s=self.step_config.stall_s,
            )
            self.steps.add_source(self.link)
        self._start_telemetry()

    def stop(self, drain_timeout: float = 10.0) -> None:
        """Stop taking work, drain in-flight HTTP requests, close sessions, publish offline, release the lock.

        The state_dir lock is released only once no thread of this agent can write there any more: a worker
        the drain timeout leaves behind (a compile that cannot be interrupted) keeps it until it ends, so a
        successor (a restarted agent in this process, a new daemon) never cleans up under a live writer."""
        self._stop.set()
        if self.notifier is not None:
            self.notifier.stopping("draining")
        if self._probe is not None:
            self._probe.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(5.0, drain_timeout))
        if self.orchestrator is not None:
            self.orchestrator.stop(timeout=drain_timeout)
        if self.server is not None:
            self.server.shutdown(drain_timeout)
        if self.link is not None:
            self.link.stop(graceful=True)
        if self.registry is not None:
            self.registry.close(drain_timeout)
        with self._status_lock:
            self._closed = True
        self._release_lock()

    def _writers(self) -> list[threading.Thread]:
        """This agent's threads that may still write into state_dir."""
        threads = self.orchestrator.live_threads() if self.orchestrator is not None else []
        if self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread():
            threads.append(self._thread)
        return threads

    def _release_lock(self) -> None:
        lock, self._lock = self._lock, None
        left = self._writers() if lock is not None else []
        if not left:
            if lock is not None:
                lock.release()
            self._unlocked.set()
            return
        self._emit(
            {
                "event": "warning",
                "reason": f"{len(left)} thread(s) still finishing after the drain timeout "
                f"({', '.join(t.name for t in left)}); state_dir stays locked until they end",
            }
        )
        assert lock is not None  # threads are left behind only while the lock is held

        def release_when_done() -> None:
            for t in left:
                t.join()
            lock.release()
            self._unlocked.set()

        threading.Thread(target=release_when_done, name=f"unlock-{self.config.device_id}", daemon=True).start()

    def stopped(self, timeout: float | None = None) -> bool:
        """Wait until stop() finished and the state_dir lock is released (threads left behind have ended)."""
        return self._unlocked.wait(timeout)

    def reload(self, new) -> dict[str, Any]:
        """SIGHUP: apply what can change live (serving token, trusted keys, telemetry interval); name the rest."""
        from agent.config import changed_keys

        live, restart = changed_keys(self.config, new)
        if self.notifier is not None:
            self.notifier.reloading()
        if self.server is not None:
            self.server.set_token(new.serving.token())
        if self.link is not None and "trust.public_keys" in live:
            self.link.reload_keys(new.trust.public_keys)
        applied = sorted((live - {"groups"}) | ({"serving.token_file"} if self.server is not None else set()))
        self.config = _with(self.config, trust=new.trust, telemetry=new.telemetry, serving=new.serving)
        if self.notifier is not None:
            self.notifier.ready(self._one_line())
        return {"applied": applied, "needs_restart": sorted(restart | (live & {"groups"}))}

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stop() (True) or timeout (False)."""
        return self._stop.wait(timeout)

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    # ---- parts ---------------------------------------------------------------------------------
    def _start_http(self) -> None:
        from agent.serving.server import OIPServer

        s = self.config.serving
        self.server = OIPServer(
            self.registry,
            s.host,
            s.port,
            s.token(),
            max_connections=s.max_connections,
            max_per_peer=s.max_per_peer,
            header_timeout=s.header_timeout_s,
            idle_timeout=s.idle_timeout_s,
        ).start()
        if self.telemetry is not None:
            self.server.add_metrics_collector(self.telemetry.collector)

    def _start_telemetry(self) -> None:
        try:
            from agent.telemetry import Telemetry, registry_stats
        except ImportError:
            return
        reg = self.registry
        self.telemetry = Telemetry(
            self.state_dir,
            profile=self.profile,
            root=str(self.sysroot or "/"),
            stats=lambda: registry_stats(reg),
            device_id=self.config.device_id,
        )
        if self.health_source is None:
            self.health_source = self.telemetry.collect

    def _start_mqtt(self) -> None:
        assert self.link is not None  # _build made it: config.mqtt is set
        self.link.start()

    def _on_connection(self, connected: bool, reason: str) -> None:
        self._emit({"event": "mqtt", "connected": connected, "reason": reason})
        if connected:
            assert self.orchestrator is not None  # the link calls back only after _build
            self.orchestrator.source_up("manifest")
            self.write_status()

    def _on_rejected(self, record: dict[str, Any]) -> None:
        """A desired state refused before the lifecycle saw it: logged, reported as an event, in status."""
        self._emit({"event": "rejected", **record})
        assert self.link is not None  # called by the link itself
        self.link.publish_event(
            {
                "deployment_id": None,
                "model": record["model"],
                "version": record.get("version"),
                "state": "rejected",
                "reason": record.get("reason"),
                "code": record.get("code"),
                "ts": record.get("ts"),
            }
        )
        self._status_dirty = True

    # ---- the loop: inbox, control requests, MQTT desired state, watchdog, health -----------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            for job in (self._scan_inbox, self._scan_control, self._poll_link, self._health):
                try:
                    job()
                except EdgeAgentError as exc:
                    self._emit({"event": "error", "reason": str(exc)})
                except Exception as exc:  # noqa: BLE001 - the loop must survive any one bad input
                    self._emit({"event": "error", "reason": f"{type(exc).__name__}: {exc}"})
            wait = self.notifier.tick(LOOP_S) if self.notifier is not None else LOOP_S
            self._stop.wait(wait)

    def _scan_inbox(self) -> None:
        inbox = self.config.inbox
        if inbox is None or not Path(inbox).is_dir():  # local mode, or an inbox set explicitly beside mqtt
            return
        assert self.orchestrator is not None and self.steps is not None  # the loop starts after _build
        with self.orchestrator.exclusive():
            claimed = {d.source.get("path") for d in self.orchestrator.journal.in_flight()}
            self.steps.sources["inbox"].scan(
                Path(inbox),
                claimed,
                self.orchestrator.submit,
                lambda path, reason: self._emit({"event": "warning", "path": path, "reason": reason}),
            )

    def _scan_control(self) -> None:
        for req_id, req in control.pending(self.state_dir):
            if req_id in self._control_busy:
                continue
            self._control_busy.add(req_id)
            threading.Thread(
                target=self._serve_control, args=(req_id, req), daemon=True, name=f"control-{req_id}"
            ).start()

    def _serve_control(self, req_id: str, req: dict[str, Any] | None) -> None:
        dep: Deployment | None
        try:
            assert self.orchestrator is not None and self.registry is not None  # the loop starts after _build
            if not isinstance(req, dict) or req.get("op") not in control.OPS or not isinstance(req.get("model"), str):
                result = {"ok": False, "error": "malformed control request"}
            elif control.expired(req):
                result = {"ok": False, "error": f"request older than {control.MAX_AGE_S:.0f}s: not executed"}
            elif req["op"] == "rollback":
                dep = self.orchestrator.rollback(req["model"], wait=120)
                ok = dep.state is State.COMMITTED or (
                    dep.source.get("kind") != "rollback" and dep.state is State.ROLLED_BACK
                )
                result = {
                    "ok": ok,
                    "deployment": dep.summary(),
                    "model": dep.model,
                    "serving": self.registry.models().get(dep.model),
                    **({} if ok else {"error": dep.reason}),
                }
            else:
                dep = self.orchestrator.cancel(req["model"])
                result = {
                    "ok": dep is not None,
                    "model": dep.model if dep else req["model"],
                    **({"deployment": dep.summary()} if dep else {"error": f"nothing in flight for {req['model']!r}"}),
                }
        except EdgeAgentError as exc:
            result = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - answered, never raised into a thread
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        control.answer(self.state_dir, req_id, result)
        self._control_busy.discard(req_id)

    def _poll_link(self) -> None:
        if self.link is not None:
            self.link.poll()
            if self._status_dirty:
                self._status_dirty = False
                self.write_status()

    def _health(self) -> None:
        interval = self.config.telemetry.interval_s
        if not interval or self.link is None or time.monotonic() - self._last_health < interval:
            return
        self._last_health = time.monotonic()
        self.link.publish_health(self._health_doc())

    def _health_doc(self) -> dict[str, Any]:
        if self.health_source is not None:
            doc = dict(self.health_source())
        else:
            assert self.registry is not None  # the loop starts after _build
            doc = {"models": {n: self.registry.stats(n) for n in self.registry.models()}}
        if self.disk_full is not None:
            doc["disk_full"] = self.disk_full
        return doc

    # ---- reporting -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        if self.orchestrator is None or self.steps is None:
            raise RuntimeError("DeviceAgent.status() before start(): no lifecycle yet")
        extra = {
            "mode": self.config.mode,
            "serving": {"url": self.url},
            "pid": _pid(),
            "providers_source": self._providers_source,
            "in_flight": {n: d.state.value for n, d in self.orchestrator.in_flight().items()},
            "qualification_queue": self.steps.qualify_queue.snapshot(),  # one at a time: running, waiting
        }
        if self.disk_full is not None:
            extra["disk_full"] = self.disk_full
        if self._retrying:
            extra["retrying"] = dict(self._retrying)
        if self.link is not None:
            extra["rejected"] = dict(self.link.rejected)  # desired states refused before the lifecycle saw them
        return build_status(
            self.state_dir,
            device_id=self.config.device_id,
            groups=self.config.groups,
            target=self.target.name if self.target else None,
            hardware=hardware_summary(self.profile),
            providers=self._providers(),
            registry=self.registry,
            unavailable=self.steps.unavailable,
            notes=self.steps.notes,
            extra=extra,
            stale=self.steps.stale,
        )

    def _providers(self) -> list[str]:
        """Providers available on this device, in the target's preference order."""
        return list(self._available)

    def _start_probe(self) -> None:
        """Background probe of the providers (child process); until it answers, the last probe's list (from
        status.json) stands in. Skipped when the caller told us the providers."""
        if self._known_providers is not None:
            return
        from agent.lifecycle.probe import ProviderProbe
        from agent.util.atomic import read_json

        try:
            last = read_json(status_path(self.state_dir)) or {}
        except ValueError:
            last = {}
        if isinstance(last.get("providers"), list) and last.get("target") == (
            self.target.name if self.target else None
        ):
            self._available, self._providers_source = [str(p) for p in last["providers"]], "last probe"
        self._probe = ProviderProbe(self.profile, self.target.name if self.target else None)
        threading.Thread(target=self._probe_providers, name="probe-providers", daemon=True).start()

    def _probe_providers(self) -> None:
        """Background: which providers are usable here (for the status document), then republish status."""
        assert self._probe is not None  # _start_probe sets it before starting this thread
        try:
            self._available, self._providers_source = self._probe.run(), "probed"
        except EdgeAgentError as exc:
            if not self._stop.is_set():
                self._providers_source = f"probe failed: {exc}"
                self._emit({"event": "warning", "reason": str(exc)})
            return
        if not self._stop.is_set() and self.orchestrator is not None:
            self.write_status()

    def write_status(self) -> dict[str, Any]:
        with self._status_lock:
            doc = self.status()
            if self._closed:
                return doc  # stopped: the state_dir may belong to a successor already
            self._write_status_file(doc)
            if self.link is not None:
                self.link.publish_status(doc)
            if self.notifier is not None:
                self.notifier.status(self._one_line())
            return doc

    def _write_status_file(self, doc: dict[str, Any]) -> None:
        """status.json; a full disk degrades (keep serving, `disk_full` in status and health), never stops us."""
        try:
            atomic_write_json(status_path(self.state_dir), doc, mode=0o600)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            first = self.disk_full is None
            self.disk_full = f"{self.state_dir}: {exc.strerror} (status.json not written; serving goes on)"
            doc["disk_full"] = self.disk_full
            if first:
                self._emit({"event": "warning", "reason": self.disk_full, "disk_full": True})
            return
        if self.disk_full is not None:
            self.disk_full = None
            doc.pop("disk_full", None)
            atomic_write_json(status_path(self.state_dir), doc, mode=0o600)
            self._emit({"event": "disk_ok", "reason": "status.json written again"})

    def _one_line(self) -> str:
        models = self.registry.models() if self.registry is not None else {}
        return "serving " + (", ".join(f"{n} v{v}" for n, v in sorted(models.items())) or "no models")

    def _on_transition(self, record: dict[str, Any]) -> None:
        self._emit({"event": "progress" if "progress" in record else "transition", **record})
        if record.get("progress") == "retry":  # a transient failure being retried: status keeps the reason
            keep = ("deployment_id", "version", "attempt", "wait_s", "reason", "ts")
            self._retrying[record["model"]] = {k: record.get(k) for k in keep}
            self.write_status()
            return
        if "progress" in record:
            return
        model = record.get("model")
        if model is not None:
            self._retrying.pop(model, None)
        if self.link is not None:
            self.link.publish_event(record)
        self.write_status()

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"device_id": self.config.device_id, **record})
            except Exception:  # noqa: BLE001 - a broken log sink must not stop the daemon
                pass


def _detect(sysroot):
    from agent.targets import detect_device as detect

    return detect(root=str(sysroot) if sysroot else "/")


def _target(name: str, profile):
    from agent import targets

    return targets.resolve(profile, name)


def _with(cfg, **changes):
    import dataclasses

    return dataclasses.replace(cfg, **changes)


def _pid() -> int:
    return os.getpid()
