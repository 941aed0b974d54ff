"""Rollouts inside the service on agent.fleet's engine (cohorts, canary, waves, halt, rollback), its state kept
in the database, plus the AWS IoT Jobs knobs: a rate limit (devices per minute), a minimum number of finished
devices before the failure threshold applies, and a per-wave deadline (the engine's deadline_s, counted from
each wave's start)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from agent.controlplane.db import write
from agent.controlplane.models import Rollout
from agent.fleet import rollout_hold as hold
from agent.fleet import rollout_recall as recall
from agent.fleet import rollout_state as rs
from agent.fleet.rollout import RolloutEngine
from agent.fleet.rollout_plan import RolloutSpec, plan

QUEUED = "queued"  # a device of a started wave the rate limit has not published yet (field `queued`)


class ServiceRolloutEngine(RolloutEngine):
    """The engine with its state saved to the rollouts table and the service's knobs applied."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        state: dict,
        link,
        issuer,
        knobs: dict[str, Any],
        progress=None,
        clock=time.time,
    ):
        from agent.controlplane.ledger import LedgerLink

        # every desired state recorded (fenced) before it is published: none goes out twice, across leaders
        ledger = LedgerLink(
            link, factory, state["rollout_id"], lambda: (self.state.get("rollback") or {}).get("request")
        )
        super().__init__(None, state, ledger, issuer, progress, clock=clock)
        self.factory, self.knobs = factory, dict(knobs)

    # rate limit: a started wave's devices are published at most rate_per_minute a minute
    def _start_wave(self, key: str, wave: int) -> None:
        rate = self.knobs.get("rate_per_minute")
        if not rate:
            return super()._start_wave(key, wave)
        cohort, now = self.state["cohorts"][key], self.clock()
        cohort["wave_started"][str(wave)] = now
        for dev in cohort["waves"][wave]:
            self.state["devices"][dev].update(result=rs.IN_PROGRESS, published=None, reason=None, queued=True)
        self._save()
        self._release()
        self.progress("wave_started", cohort=key, wave=wave, devices=len(cohort["waves"][wave]))

    def _release(self) -> None:
        rate = float(self.knobs.get("rate_per_minute") or 0)
        queued = sorted(d for d, v in self.state["devices"].items() if v.get("queued"))
        if not rate or not queued:
            return
        bucket = self.state.setdefault("rate", {"since": self.clock(), "sent": 0})
        allowed = int((self.clock() - bucket["since"]) * rate / 60.0) + 1 - bucket["sent"]
        sent = queued[: max(0, allowed)]
        if not sent:
            return
        for dev in sent:
            self.state["devices"][dev].update(queued=False, published=self.clock())
        bucket["sent"] += len(sent)
        self._save()  # persist before acting: a restart republishes them, never a queued one
        for dev in sent:
            self._publish_forward(dev)

    def step(self) -> bool:
        if self.state["state"] not in rs.ROLLOUT_FINAL:
            self._release()
        return super().step()

    def republish(self) -> None:
        queued = {d for d, v in self.state["devices"].items() if v.get("queued")}
        for dev in queued:
            self.state["devices"][dev]["result"] = QUEUED  # not in flight: nothing to publish again
        try:
            super().republish()
        finally:
            for dev in queued:
                self.state["devices"][dev]["result"] = rs.IN_PROGRESS

    # minimum finished devices before the failure threshold applies
    def _failures(self, key: str) -> tuple[int, int, str | None]:
        failed, attempted, first = super()._failures(key)
        finished = sum(
            1
            for d in self.state["devices"].values()
            if d["cohort"] == key and d["result"] not in (rs.PENDING, rs.IN_PROGRESS)
        )
        if finished < int(self.knobs.get("min_devices") or 0):
            return 0, attempted, first
        return failed, attempted, first

    # devices not judged: the wave waits for an operator's word (agent.fleet.rollout_hold)
    def _hold(self, key: str, wave: int, statuses: dict) -> tuple[bool, bool]:
        return hold.check(self, key, wave, statuses)

    def decide_unjudged(self, request: str) -> dict[str, Any]:
        """Apply the operator's word on the devices not judged (accept or roll back), named by `request`."""
        return hold.decide(self, request)

    def operator_rollback(self, reason: str, request: str | None = None) -> dict[str, Any]:
        """Roll back every device that took or is taking the version, in every cohort (running ones halt
        through the engine's own halt); `request` names the operator's request this answers (repeatable)."""
        return recall.recall(self, request or reason, reason)

    def _settle(self) -> bool:
        settled = super()._settle()
        if settled:
            recall.finish(self)  # a roll back in progress gets its result
        return settled

    def _save(self) -> None:
        now = time.time()
        self.state["updated"] = now
        final = self.state["state"] in rs.ROLLOUT_FINAL
        answered = (self.state.get("rollback") or {}).get("request")
        progress = rs.progress_doc(self.state)
        with write(self.factory) as s:
            row = s.get(Rollout, self.state["rollout_id"], with_for_update=True)
            if row is not None:
                row.state, row.updated_at, row.progress = _copy(self.state), now, _copy(progress)
                # a roll back asked for since this engine last looked keeps the rollout running until applied
                asked = row.rollback_requested is not None and row.rollback_requested != answered
                row.phase = "finished" if final and not asked else "running"
        self.link.publish_progress(self.state["rollout_id"], progress)


def _copy(state: dict) -> dict:
    import json

    return json.loads(json.dumps(state))  # a fresh object: SQLAlchemy sees the JSON column change


def new_state(spec: RolloutSpec, population: dict[str, dict], manifest_info: dict, extras) -> dict:
    """Plan a rollout (agent.fleet.rollout_plan) and its persisted manifests (agent.fleet.rollout_run)."""
    spec.validate()
    planned = plan(spec, population)
    more = extras(planned)
    state = rs.new_state(f"{spec.name}-{spec.version}", spec, planned, manifest_info, time.time())
    state.update(more)
    return state
