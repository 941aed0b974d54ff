"""The service's one fleet loop (a thread): retained device status in over MQTT (verified against the accepted
devices' keys; only verified reports change the registry), rollouts stepped, operator requests applied."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer, sessionmaker

from agent.controlplane import alerts, statusintake
from agent.controlplane.db import StorageError, write
from agent.controlplane.models import ACCEPTED, Device, ModelVersion, Rollout
from agent.controlplane.releases import fill_shas
from agent.controlplane.runner import ServiceRolloutEngine, new_state
from agent.controlplane.telemetry_intake import HealthInbox
from agent.controlplane.telemetry_intake import ingest as ingest_health
from agent.errors import EdgeAgentError
from agent.fleet.agent_release import RELEASE_NAME
from agent.fleet.registry import DeviceRegistry
from agent.fleet.rollout_plan import RolloutSpec

log = logging.getLogger("edge_agent.controlplane")


def registry_from_db(factory: sessionmaker[Session]) -> DeviceRegistry:
    with factory() as s:
        rows = s.execute(
            select(Device.device_id, Device.public_key, Device.key_id, Device.groups).where(Device.state == ACCEPTED)
        ).all()
    return DeviceRegistry({d: {"public_key": pem, "key_id": kid, "groups": list(g or [])} for d, pem, kid, g in rows})


class FleetLoop:
    def __init__(self, factory: sessionmaker[Session], settings, key=None):
        self.factory, self.settings, self.key = factory, settings, key
        self.registry = registry_from_db(factory)
        self.registry_dirty = threading.Event()  # set: the whole registry is read again (no device named)
        self._changed_devices: set[str] = set()  # accepted, rejected, re-keyed since the last tick
        self._changed_lock = threading.Lock()
        self.reloads = 0  # whole-registry reads since start (an enrollment names its device: none)
        self.wake = threading.Event()
        self.stop_event = threading.Event()
        self.engines: dict[str, ServiceRolloutEngine] = {}
        self.link: Any = None
        self.health = HealthInbox(settings.prefix)  # health telemetry (agent.controlplane.telemetry_intake)
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> "FleetLoop":
        from agent.fleet.rollout_link import FleetLink

        self.link = FleetLink(self.settings.broker_url, self.settings.prefix, registry=self.registry)
        self.link.__enter__()
        self.link.watch.link.subscribe(self.health.topic_filter(), self.health.on_message, qos=0)
        self._resume()
        self._thread = threading.Thread(target=self._run, name="cp-fleet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.link is not None:
            self.link.__exit__(None, None, None)

    # -- the loop ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick()
                self.error = None
            except StorageError as exc:
                self.error = str(exc)  # shown on the dashboard; the loop retries next tick
                log.warning("fleet loop: %s", exc)
            except Exception as exc:  # noqa: BLE001 - the loop must survive one bad turn
                self.error = f"{type(exc).__name__}: {exc}"
                log.exception("fleet loop turn failed")
            self.link.wait_change(self.settings.tick_s)

    def devices_changed(self, device_ids) -> None:
        """These devices' registry entries changed in the database (enrollment accepted, rejected, re-keyed,
        deleted): the next tick reads just their rows, and believes just their kept statuses again."""
        with self._changed_lock:
            self._changed_devices.update(device_ids)
        self.wake.set()

    def tick(self) -> None:
        self._refresh_registry()
        self._ingest(self.link.watch.take_changed())
        self._rollouts()
        self._telemetry()

    def _telemetry(self) -> None:
        """Health messages in (a newly accepted device's counts from its next one); a fault here is logged and
        never stops statuses or rollouts."""
        try:
            ingest_health(self.factory, self.registry, self.health, self.settings, time.time())
        except Exception as exc:  # noqa: BLE001 - telemetry is never worth a rollout's turn
            log.warning("fleet loop: health telemetry not kept: %s", exc)

    def _refresh_registry(self) -> None:
        """Entries of the devices named since the last tick (or the whole registry, when none was named), put
        one at a time; their kept statuses believed again. Never a resubscription to every device's status."""
        with self._changed_lock:
            named, self._changed_devices = self._changed_devices, set()
        if self.registry_dirty.is_set():  # nobody named the devices: every entry read again (no resubscription)
            self.registry_dirty.clear()
            self.reloads += 1
            fresh = registry_from_db(self.factory).devices
            for dev in set(self.registry.devices) | set(fresh):
                if self.registry.devices.get(dev) != fresh.get(dev):
                    self.registry.put(dev, fresh.get(dev))
                    named.add(dev)
        elif named:
            kids = {str(e.get("key_id")) for d in named if (e := self.registry.devices.get(d))}
            for dev, entry in statusintake.entries(self.factory, named, kids).items():
                self.registry.put(dev, entry)
                named.add(dev)  # a device that held a moved key too
        if named and self.link is not None:
            self.link.watch.believe_again(named)

    def _ingest(self, statuses: dict[str, dict]) -> None:
        if statuses:
            alerts_cfg = self.settings.alerts
            statusintake.ingest(
                self.factory, self.settings.limits, statuses, lambda s, kept: _device_alerts(s, kept, alerts_cfg)
            )

    # -- rollouts ------------------------------------------------------------------------------------------
    def _resume(self) -> None:
        """After a (re)start: every unfinished rollout gets its engine back and republishes what is in flight
        (byte-identical envelopes: a device that got one already sees nothing new)."""
        with self.factory() as s:
            rows = s.scalars(select(Rollout).where(Rollout.phase == "running")).all()
        for row in rows:
            if row.state:
                engine = self._engine(row)
                engine.republish()

    def _engine(self, row: Rollout) -> ServiceRolloutEngine:
        from agent.fleet.rollout_link import ManifestIssuer

        engine = self.engines.get(row.rollout_id)
        if engine is None:
            assert row.state is not None
            issuer = ManifestIssuer(self.key, row.state["manifests"])
            engine = ServiceRolloutEngine(self.factory, row.state, self._link_for(row.spec), issuer, row.knobs)
            self.engines[row.rollout_id] = engine
        return engine

    def _link_for(self, spec: dict[str, Any]) -> Any:
        """The fleet as a rollout sees it: an agent release's reads each status's `agent_release` as a model."""
        from agent.fleet.agent_release import ReleaseView, kind_of

        return ReleaseView(self.link) if kind_of(spec.get("name")) == "agent" else self.link

    def _rollouts(self) -> None:
        # each tick: the rollouts' small columns; a rollout's state (every device's entry) only for a new engine
        live = select(Rollout).options(defer(Rollout.state)).where(Rollout.phase.in_(("starting", "running")))
        with self.factory() as s:
            rows = s.scalars(live).all()
        for row in rows:
            if row.phase == "starting" and row.rollback_requested:
                self._cancel(row)  # rolled back before any device was told
                continue
            if row.phase == "starting":
                self._plan(row)
                continue
            if row.rollout_id not in self.engines:
                with self.factory() as s:
                    full = s.get(Rollout, row.rollout_id)
                if full is None or not full.state:
                    continue
                row = full
            engine = self._engine(row)
            answered = (engine.state.get("rollback") or {}).get("request")
            if row.rollback_requested and row.rollback_requested != answered:
                engine.operator_rollback(_reason(row.rollback_requested), row.rollback_requested)
            said = (engine.state.get("unjudged") or {}).get("request")
            if row.unjudged_decision and row.unjudged_decision != said:
                engine.decide_unjudged(row.unjudged_decision)  # accept or roll back the devices not judged
            if row.paused and not row.rollback_requested:
                continue  # halted by an operator: no wave starts, nothing is judged until resumed
            if engine.step():
                self.engines.pop(row.rollout_id, None)

    def _cancel(self, row: Rollout) -> None:
        with write(self.factory) as s:
            r = s.get(Rollout, row.rollout_id)
            if r is not None and r.state is None:
                r.phase, r.reason, r.updated_at = "finished", f"{row.rollback_requested} before it started", time.time()

    def _plan(self, row: Rollout) -> None:
        from agent.fleet.rollout_run import _manifest_extras, _sources, registered_population, stored_artifact

        spec = RolloutSpec.from_dict(row.spec)
        try:
            if self.key is None:
                raise EdgeAgentError("signing_key: the control plane has no fleet signing key configured")
            with self.factory() as s:
                mv = s.scalar(
                    select(ModelVersion).where(ModelVersion.name == spec.name, ModelVersion.version == spec.version)
                )
            if mv is None:
                raise EdgeAgentError(f"model {spec.name} {spec.version} is not uploaded")
            artifact = stored_artifact(self.settings.uploads_dir, mv.sha256, mv.format)
            if artifact is None:
                raise EdgeAgentError(f"artifact {mv.sha256} is not in {self.settings.uploads_dir} (uploads_dir)")
            sources = _sources(artifact, None)
            warnings: list[str] = []
            extras = _manifest_extras(
                spec,
                self.settings.uploads_dir,
                artifact,
                sources,
                time.time(),
                lambda event, **f: warnings.append(str(f.get("message"))),
                self.link,
            )
            population = registered_population(self.registry, self._link_for(row.spec).statuses())
            if spec.name == RELEASE_NAME:
                population = fill_shas(self.factory, population)  # the release each device came with
            info = {"sha256": artifact["sha256"], "size": artifact["size"], "format": artifact.get("format")}
            state = new_state(spec, population, info, extras)
        except EdgeAgentError as exc:
            with write(self.factory) as s:
                r = s.get(Rollout, row.rollout_id)
                if r is not None:
                    r.phase, r.reason, r.updated_at = "failed", str(exc), time.time()
            return
        with write(self.factory) as s:
            r = s.get(Rollout, row.rollout_id)
            if r is None:
                return
            r.state, r.phase, r.updated_at = state, "running", time.time()
            row = r
        self._engine(row).republish()


def _device_alerts(s: Session, kept: dict[str, dict], cfg) -> None:
    """Stored statuses raise or clear their devices' rolled-back and not-judged alerts (never stops ingestion);
    the batch's active alerts read in one query."""
    try:
        active = alerts.active_device_alerts(s, sorted(kept))
    except Exception:  # noqa: BLE001 - an alert is never worth a device's status
        log.exception("fleet loop: alerts of %d devices not updated", len(kept))
        return
    now = time.time()
    for dev, status in kept.items():
        try:
            alerts.on_status(s, dev, status, now, cfg, active.get(dev, []))
        except Exception:  # noqa: BLE001 - an alert is never worth a device's status
            log.exception("fleet loop: alerts of %s not updated", dev)


def _reason(request: str) -> str:
    """The operator's words of a roll back request, without its request number."""
    return request.split(" (request ", 1)[0]
