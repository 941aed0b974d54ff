"""The fleet side of one replica: the artifact server (every replica runs one: chunk requests are shared between
them) and, on the one replica holding the lease (agent.controlplane.lease), the fleet loop: retained status in,
rollouts stepped, desired state out. A renewal thread keeps the lease (every lease_s / 5 s, or takes it once
expired); a role thread starts the fleet loop when the lease is won, resuming every rollout from the database,
and stops it when the lease is lost. A broker that does not answer is retried every 5 s."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import func, select

from agent.controlplane.lease import Lease
from agent.controlplane.models import ACCEPTED, AuditEntry, Device
from agent.errors import EdgeAgentError

log = logging.getLogger("edge_agent.controlplane")
RETRY_S = 5.0
# the accepted devices are counted when the audit log moved (every change to them is audited with it), and at least
# this often: on PostgreSQL a transaction may commit its audit entry below an id another one already showed
RECOUNT_S = 30.0


class FleetRole:
    def __init__(self, factory, settings, lease: Lease, key=None):
        self.factory, self.settings, self.lease, self.key = factory, settings, lease, key
        self.loop: Any = None
        self.artifacts: Any = None
        self.error: str | None = None
        self.held = threading.Event()  # the lease is held (renewed in time)
        self.changed = threading.Event()
        self.stopping = threading.Event()
        self.takeovers = 0  # times this replica became the leader
        self.led_since: float | None = None
        self._accepted: tuple[int, float] | None = None
        self._audited: tuple[int | None, float] | None = None  # (the audit log's last id, when counted)
        self._threads: list[threading.Thread] = []

    def start(self) -> "FleetRole":
        """Try the lease once now (a lone replica leads from its first second), then keep it in threads."""
        self._renew()
        self._apply()
        for target, name in ((self._renewing, "cp-lease"), (self._role, "cp-fleet-role")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.changed.set()
        for t in self._threads:
            t.join(timeout=30)
        self._stop_loop()
        if self.artifacts is not None:
            self.artifacts.stop()
        self.lease.release()

    # -- the lease -------------------------------------------------------------------------------------------
    def _renew(self) -> None:
        held = self.lease.try_acquire()
        if held != self.held.is_set():
            (self.held.set if held else self.held.clear)()
            self.changed.set()

    def _renewing(self) -> None:
        every = max(0.2, self.lease.lease_s / 5.0)
        while not self.stopping.wait(every):
            try:
                self._renew()
            except Exception:  # noqa: BLE001 - the renewal must outlive one bad turn
                log.exception("leader lease: renewal failed")

    # -- the role --------------------------------------------------------------------------------------------
    def _role(self) -> None:
        while not self.stopping.is_set():
            self.changed.wait(RETRY_S if self.error else 1.0)
            self.changed.clear()
            if self.stopping.is_set():
                return
            try:
                self._apply()
                self._notice_accepted()
            except Exception:  # noqa: BLE001
                log.exception("fleet role turn failed")

    def _apply(self) -> None:
        if not self.held.is_set():
            if self.loop is not None:
                log.warning("leader lease lost (replica %s): the fleet loop stops", self.lease.holder)
                self._stop_loop()
            self._connect(lead=False)
            return
        if self.loop is None:
            self._connect(lead=True)

    def _connect(self, lead: bool) -> None:
        from agent.artifacts.store import ContentStore
        from agent.controlplane.fleetloop import FleetLoop
        from agent.fleet.artifact_server import ArtifactServer
        from agent.transport.mqtt import BrokerConfig

        st = self.settings
        try:
            if self.artifacts is None:
                st.uploads_dir.mkdir(parents=True, exist_ok=True)
                broker = BrokerConfig(str(st.broker_url))
                self.artifacts = ArtifactServer(ContentStore(st.uploads_dir), broker, st.prefix).start()
            if lead:
                self.loop = FleetLoop(self.lease.fenced_sessions(), st, self.key).start()
                self.takeovers += 1
                self.led_since = time.time()
                log.warning("replica %s leads the fleet (fence %s)", self.lease.holder, self.lease.fence)
            self.error = None
        except EdgeAgentError as exc:
            self.error = f"broker {st.broker_url}: {exc}; retrying every {RETRY_S:g} s"
            log.warning("fleet link: %s", self.error)

    def _stop_loop(self) -> None:
        loop, self.loop, self.led_since = self.loop, None, None
        if loop is not None:
            loop.stop()

    def _audit_moved(self) -> tuple[int | None, float] | None:
        """(the audit log's last id, now) where it has an entry it had not at the last count (or that count is
        RECOUNT_S old), else None: one read of its primary key's end instead of a count over the devices."""
        with self.factory() as s:
            last = s.scalar(select(func.max(AuditEntry.id)))
        now = time.monotonic()
        if self._audited is not None and self._audited[0] == last and now - self._audited[1] < RECOUNT_S:
            return None
        return last, now

    def _notice_accepted(self) -> None:
        """A device accepted on another replica: the leader reloads its registry (seen as a change in the count
        or the latest decision time of accepted devices, counted when the audit log moved)."""
        if self.loop is None:
            self._accepted = self._audited = None
            return
        audited = self._audit_moved()
        if audited is None:
            return
        with self.factory() as s:
            n, last = s.execute(select(func.count(), func.max(Device.decided_at)).where(Device.state == ACCEPTED)).one()
        now = (int(n or 0), float(last or 0.0))
        if self._accepted is not None and now != self._accepted:
            since = self._accepted[1]
            with self.factory() as s:
                ids = s.scalars(select(Device.device_id).where(Device.state == ACCEPTED, Device.decided_at > since))
                named = sorted(ids.all())
            if named and now[0] >= self._accepted[0]:  # accepted since: just their entries (no whole reload)
                self.loop.devices_changed(named)
            else:  # fewer accepted devices and none newly decided: some left; which ones, only a reread says
                self.loop.registry_dirty.set()
        self._accepted, self._audited = now, audited  # a turn that failed before here counts again

    # -- shown ------------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """/api/v1/health's `leader`: who leads, this replica's part, the fence."""
        out = self.lease.state()
        out.update(
            leading=self.loop is not None,
            takeovers=self.takeovers,
            leading_since=self.led_since,
            takeover_after_s=self.lease.lease_s,
        )
        return out
