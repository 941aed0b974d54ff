"""The daemon's parts, built once when a DeviceAgent (agent.app) starts and frozen from then on: hardware profile
and target, resolved settings, content store, registry, lifecycle steps and orchestrator, the optional MQTT
source and telemetry, and the services its loop ticks (in order) or that run beside it. `build` makes them; the
agent is handed in as a `Host` (what the parts call back: status, events, attestations, source events)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent import settings
from agent.lifecycle.orchestrator import Orchestrator
from agent.lifecycle.ports import SourceEvents
from agent.lifecycle.states import State
from agent.lifecycle.status_doc import hardware_summary
from agent.lifecycle.steps import Qualifier, StepConfig, Steps
from agent.services import cpsync
from agent.services.control import ControlService
from agent.services.health import HealthPublisher, registry_health
from agent.services.inbox import InboxScanner
from agent.services.probe import ProviderProbeService
from agent.services.report import Reporter
from agent.services.status_writer import StatusWriter
from agent.sources.inbox import InboxSource

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore
    from agent.config import AgentConfig
    from agent.hardware.profile import HardwareProfile
    from agent.services.release_update import ReleaseUpdater
    from agent.serving.registry import ModelRegistry
    from agent.sources.mqtt import MqttSource
    from agent.targets import Target
    from agent.telemetry import Telemetry

Tick = Callable[[], None]


@dataclass(frozen=True)
class Parts:
    """One started agent's parts; `ticks` is what its loop runs each turn, in order (inbox, control requests,
    MQTT desired state and the rejections it reported when there is a link, health)."""

    profile: HardwareProfile
    target: Target
    step_config: StepConfig  # resolved (agent.settings)
    store: ContentStore
    registry: ModelRegistry
    steps: Steps
    orchestrator: Orchestrator
    link: MqttSource | None  # config.mqtt
    telemetry: Telemetry | None  # None where agent.telemetry cannot be imported
    status_writer: StatusWriter
    probe: ProviderProbeService
    health: HealthPublisher
    cpsync: cpsync.ControlPlaneSync | None  # config.control_plane: enroll, post decision records
    releases: ReleaseUpdater | None  # agent releases from the control plane (a release root and MQTT)
    ticks: tuple[Tick, ...]


class Host(SourceEvents, Protocol):
    """What the parts call back into (agent.app.DeviceAgent)."""

    config: AgentConfig
    state_dir: Path
    sysroot: str | Path | None
    qualifier: Qualifier | None
    reporter: Reporter
    notifier: Any
    health_source: Callable[[], dict[str, Any]] | None
    release: tuple[Path, Any] | None  # (release root, applier): agent.services.release_update

    def status(self) -> dict[str, Any]: ...
    def write_status(self) -> dict[str, Any]: ...
    def emit(self, record: dict[str, Any]) -> None: ...
    def publish_attestation(self, model: str, kind: str, envelope: bytes) -> None: ...
    def one_line(self) -> str: ...


def build(host: Host, profile: HardwareProfile | None, chosen: StepConfig, known: list[str] | None) -> Parts:
    """Hardware profile and target, then store, registry, lifecycle, MQTT source, telemetry, services.
    `chosen`: the settings the caller chose (resolved here); `known`: providers known to be available."""
    from agent.artifacts.store import ContentStore
    from agent.evidence.attest import Attestor
    from agent.serving.registry import ModelRegistry
    from agent.targets import detect_device, resolve

    config, state_dir = host.config, host.state_dir
    profile = profile or detect_device(root=str(host.sysroot) if host.sysroot else "/")
    target = resolve(profile, config.target)
    step_config = settings.resolve(config, target, chosen)
    store = ContentStore(state_dir, file_mode=0o600)
    registry = ModelRegistry(finite_every=config.serving.finite_check_every)
    steps = Steps(
        state_dir,
        store,
        registry,
        profile=profile,
        target_name=target.name,
        config=step_config,
        qualifier=host.qualifier,
        on_note=lambda name, reason: host.emit({"event": "repair", "model": name, "reason": reason}),
        attestor=Attestor(state_dir, config.device_id, publish=host.publish_attestation),
    )
    steps.add_source(InboxSource(store, steps.staging))
    deadlines = {State(k): float(v) for k, v in step_config.deadlines.items()}
    orchestrator = Orchestrator(state_dir, steps, deadlines=deadlines, listeners=[host.reporter.on_transition])
    link = None
    if config.mqtt is not None:  # the port exists before recovery: resumed downloads wait for it
        link = _mqtt_source(host, store, orchestrator, steps, step_config)
        steps.add_source(link)
    telemetry = _telemetry(host, profile, registry)
    health_source = host.health_source or (telemetry.collect if telemetry is not None else None)
    notify = (lambda: host.notifier.status(host.one_line())) if host.notifier is not None else None
    writer = StatusWriter(
        state_dir, host.status, host.emit, publish=link.publish_status if link is not None else None, notify=notify
    )
    probe = ProviderProbeService(
        state_dir, profile, target.name, known=known, on_probed=host.write_status, emit=host.emit
    )
    health = HealthPublisher(
        config.telemetry.interval_s,
        health_source or registry_health(registry),
        lambda: writer.disk_full,
        publish=link.publish_health if link is not None else None,
    )
    inbox = InboxScanner(config.inbox, orchestrator, steps.sources["inbox"], host.emit)
    ticks: list[Tick] = [inbox.tick, ControlService(state_dir, orchestrator, registry).tick]
    releases = _releases(host, link)  # its tick: a release offered meanwhile taken, a trial's report shown
    if link is not None:  # MQTT desired state, then the rejections it reported (and agent releases)
        ticks += [link.poll, host.reporter.tick, *([releases.tick] if releases is not None else [])]
    ticks.append(health.tick)
    identity = lambda: {"target": target.name, "hardware": hardware_summary(profile)}  # noqa: E731
    sync = cpsync.for_agent(config, state_dir, identity, host.write_status, host.emit)
    return Parts(
        profile, target, step_config, store, registry, steps, orchestrator, link, telemetry, writer, probe, health,
        sync, releases, tuple(ticks),
    )  # fmt: skip


def _releases(host: Host, link: MqttSource | None) -> ReleaseUpdater | None:
    """The `edge-agent` desired state's taker when this agent runs from a release root (or was given one)."""
    from agent.services.release_update import InstallAndTrial, ReleaseUpdater, root_of_running

    root, applier = host.release or (root_of_running(), None)
    if root is None or link is None:
        return None
    updater = ReleaseUpdater(
        root,
        host.state_dir,
        applier or InstallAndTrial(host.state_dir),
        trusted=lambda: link.keys,
        fetch=link.fetch_release,
        on_change=host.write_status,
        emit=host.emit,
    )
    link.releases = updater
    return updater


def _mqtt_source(
    host: Host, store: ContentStore, orchestrator: Orchestrator, steps: Steps, step_config: StepConfig
) -> MqttSource:
    from agent.lifecycle.intake import Intake
    from agent.sources.mqtt import MqttSource

    return MqttSource(
        host.config,
        host.state_dir,
        store,
        steps.slots,
        deployments=Intake(orchestrator),
        events=host,  # SourceEvents (agent.lifecycle.ports): connection() and rejected()
        stall_s=step_config.stall_s,
    )


def _telemetry(host: Host, profile: HardwareProfile, registry: ModelRegistry) -> Telemetry | None:
    try:
        from agent.telemetry import Telemetry, registry_stats
    except ImportError:
        return None
    root, device = str(host.sysroot or "/"), host.config.device_id
    stats = lambda: registry_stats(registry)  # noqa: E731 - the figures of this agent's registry, read when asked
    return Telemetry(host.state_dir, profile=profile, root=root, stats=stats, device_id=device)
