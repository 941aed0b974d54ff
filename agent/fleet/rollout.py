"""The rollout engine: canary and waves per cohort, success thresholds, halt, signed rollback, resumable state.

The engine talks to the fleet through two small interfaces so it stays testable and transport-agnostic:
  link:   statuses() -> {device_id: retained status doc}, wait_change(timeout) -> bool,
          publish_desired(device_id, model, envelope | None), publish_progress(rollout_id, doc)
  issuer: envelope(device_id, version, rollback) -> signed envelope dict (deterministic: same bytes every time)
agent.fleet.rollout_mqtt provides both on top of the MQTT transport and the signed-manifest code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.errors import ConfigError
from agent.fleet import rollout_state as rs
from agent.fleet.outcome import StatusDoc
from agent.fleet.outcome import untrusted as report_untrusted
from agent.fleet.rollout_plan import Planned, RolloutSpec, over_budget, plan, rollout_id

Progress = Callable[..., None]


class RolloutLink(Protocol):
    """The fleet as the engine sees it (agent.fleet.rollout_link.FleetLink over MQTT)."""

    def statuses(self) -> dict[str, StatusDoc]: ...

    def wait_change(self, timeout: float) -> bool: ...

    def publish_desired(self, device_id: str, model: str, envelope: bytes | None) -> None: ...

    def publish_progress(self, rollout_id: str, doc: dict[str, Any]) -> None: ...


class Issuer(Protocol):
    """Signs a device's envelope (agent.fleet.rollout_link.ManifestIssuer); None when the version is unknown."""

    def envelope(self, device_id: str, version: str, rollback: bool) -> bytes | None: ...


def _noop(event: str, **fields: Any) -> None:
    return None


def open_rollout(
    store: str | Path,
    spec: RolloutSpec,
    statuses: dict[str, StatusDoc],
    manifest_info: dict[str, Any],
    now: float | None = None,
    extras: Callable[[Planned], dict[str, Any]] | None = None,
) -> tuple[rs.RolloutState, bool]:
    """Load the persisted rollout for (name, version), or plan and persist a new one. Returns (state, resumed).

    `extras(planned)` may add persisted fields to a new rollout (the signed-manifest bases, warnings)."""
    spec.validate()
    rid = rollout_id(spec.name, spec.version)
    state = rs.load_state(store, rid)
    if state is not None:
        if state["spec"] != spec.to_dict():
            diff = {k: (state["spec"].get(k), v) for k, v in spec.to_dict().items() if state["spec"].get(k) != v}
            raise ConfigError(
                f"rollout {rid} already exists in {rs.state_path(store, rid)} with other settings "
                f"(saved vs asked: {diff}); publish a new --version instead"
            )
        if state["artifact"].get("sha256") != manifest_info.get("sha256"):
            raise ConfigError(
                f"rollout {rid} was started with artifact {state['artifact'].get('sha256')}, "
                f"this package is {manifest_info.get('sha256')}; publish a new --version instead"
            )
        return state, True
    planned = plan(spec, statuses)
    more = extras(planned) if extras else {}  # may annotate planned devices too
    state = rs.new_state(rid, spec, planned, manifest_info, time.time() if now is None else now)
    state.update(more)
    rs.save_state(store, state)
    return state, False


class RolloutEngine:
    """Drives one persisted rollout forward from the devices' retained status."""

    def __init__(
        self,
        store: str | Path | None,  # None: a subclass saves the state elsewhere (agent.controlplane.runner)
        state: rs.RolloutState,
        link: RolloutLink,
        issuer: Issuer,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.state, self.link, self.issuer = store, state, link, issuer
        self.spec = RolloutSpec.from_dict(state["spec"])
        self.progress = progress or _noop
        self.clock = clock

    # -- driving ---------------------------------------------------------------------------------------------
    def run(self, wait: bool = True, stop: threading.Event | None = None, tick_s: float = 1.0) -> dict[str, Any]:
        """Republish what is in flight (idempotent), then step until finished (or once, without wait)."""
        self.republish()
        while True:
            finished = self.step()
            if finished or not wait or (stop is not None and stop.is_set()):
                return rs.summary(self.state)
            self.link.wait_change(tick_s)

    def republish(self) -> None:
        """After a restart: publish again every envelope that may not have reached the broker."""
        for dev, d in self.state["devices"].items():
            if d["result"] == rs.IN_PROGRESS:
                self._publish_forward(dev)
            elif d["result"] == rs.ROLLBACK_PENDING:
                self._publish_rollback(dev)
            elif d.get("desired_restored") is False:
                self._restore_desired(dev)
        self.link.publish_progress(self.state["rollout_id"], rs.progress_doc(self.state))

    def step(self) -> bool:
        """Advance every cohort once from the current statuses; persist and publish progress on change."""
        if self.state["state"] in rs.ROLLOUT_FINAL:
            return True
        statuses = self.link.statuses()
        changed = False
        for key, cohort in self.state["cohorts"].items():
            if cohort["state"] == rs.RUNNING:
                changed |= self._advance(key, statuses)
            if cohort["state"] == rs.ROLLING_BACK:
                changed |= self._advance_rollback(key, statuses)
        changed |= self._settle()
        if changed:
            self._save()
        return self.state["state"] in rs.ROLLOUT_FINAL

    # -- forward path ----------------------------------------------------------------------------------------
    def _advance(self, key: str, statuses: dict[str, StatusDoc]) -> bool:
        cohort, changed = self.state["cohorts"][key], False
        while cohort["state"] == rs.RUNNING:
            wave = cohort["wave"]
            if str(wave) not in cohort["wave_started"]:
                self._start_wave(key, wave)
                changed = True
            changed |= self._observe(key, statuses)
            failed, attempted, first = self._failures(key)
            if over_budget(failed, attempted, self.spec.failure_budget):
                self._halt(
                    key, f"{failed} of {attempted} devices failed (max {self.spec.max_failures}); first: {first}"
                )
                return True
            if any(self.state["devices"][d]["result"] == rs.IN_PROGRESS for d in cohort["waves"][wave]):
                return changed
            held, moved = self._hold(key, wave, statuses)
            changed |= moved
            if held:
                return changed
            if wave + 1 < len(cohort["waves"]):
                cohort["wave"] = wave + 1
            else:
                cohort["state"] = rs.COMPLETED
                self.progress("cohort_completed", cohort=key, devices=attempted, failed=failed)
            changed = True
        return changed

    def _hold(self, key: str, wave: int, statuses: dict[str, Any]) -> tuple[bool, bool]:
        """(held, changed): does the finished wave wait for something more before the next starts? Here never;
        the control plane's engine waits for an operator's word on devices not judged (agent.fleet.rollout_hold)."""
        return False, False

    def _start_wave(self, key: str, wave: int) -> None:
        cohort, now = self.state["cohorts"][key], self.clock()
        ids = cohort["waves"][wave]
        cohort["wave_started"][str(wave)] = now
        for dev in ids:
            self.state["devices"][dev].update(result=rs.IN_PROGRESS, published=now, reason=None)
        self._save()  # persist before acting: a restart republishes this wave
        for dev in ids:
            self._publish_forward(dev)
        kind = "canary" if wave == 0 and cohort["canary"] else "wave"
        self.progress("wave_started", cohort=key, wave=wave, kind=kind, devices=len(ids))

    def _observe(self, key: str, statuses: dict[str, StatusDoc]) -> bool:
        changed, now = False, self.clock()
        started = self.state["cohorts"][key]["wave_started"]
        for dev, d in self.state["devices"].items():
            if d["cohort"] != key or d["result"] != rs.IN_PROGRESS:
                continue
            doc = statuses.get(dev)
            result, reason = rs.observe(doc, self.spec.name, self.spec.version)
            untrusted = report_untrusted(doc)  # shown, never counted: neither a success nor a failure
            if result is None and untrusted and d.get("reason") != untrusted:
                d["reason"] = untrusted
                self.progress("device", device_id=dev, cohort=key, result=rs.IN_PROGRESS, reason=untrusted)
                changed = True
            if result is None and now - started[str(d["wave"])] > self.spec.deadline_s:
                seen = "online" if (doc or {}).get("online") else "offline"
                result = rs.FAILED
                reason = f"silent: no result within {self.spec.deadline_s:g} s ({seen}{'; ' + untrusted if untrusted else ''})"
            if result is not None:
                d.update(result=result, reason=reason, finished=now)
                self.progress("device", device_id=dev, cohort=key, result=result, reason=reason)
                changed = True
        return changed

    def _failures(self, key: str) -> tuple[int, int, str | None]:
        failed = attempted = 0
        first = None
        for dev, d in sorted(self.state["devices"].items(), key=lambda kv: kv[1].get("finished") or 0):
            if d["cohort"] != key or d["result"] == rs.PENDING:
                continue
            attempted += 1
            if d["result"] == rs.FAILED or (d["result"] == rs.NOT_JUDGED and self.spec.halt_on_unjudged):
                failed += 1
                why = d["reason"] if d["result"] == rs.FAILED else f"{d['result']}: {d['reason']}"
                first = first or f"{dev}: {why}"
        return failed, attempted, first

    # -- halt and roll back ----------------------------------------------------------------------------------
    def _halt(self, key: str, reason: str) -> None:
        cohort, now = self.state["cohorts"][key], self.clock()
        cohort.update(state=rs.ROLLING_BACK, reason=reason, rollback_started=now)
        for d in self.state["devices"].values():
            if d["cohort"] != key:
                continue
            if d["result"] == rs.PENDING:
                d.update(result=rs.NOT_REACHED, reason=f"cohort halted: {reason}")
            elif d["result"] in (rs.IN_PROGRESS, *rs.TOOK):
                took = d["result"] in rs.TOOK
                back = f"back to {d['previous_version']}" if d["previous_version"] else "no earlier version"
                why = f"took {self.spec.version}" if took else "in flight at the halt"
                d.update(took=took, result=rs.ROLLBACK_PENDING, reason=f"{why}; rolling back ({back})")
            elif d["result"] == rs.FAILED:
                d["desired_restored"] = False
        self._save()
        self.progress("cohort_halted", cohort=key, reason=reason)
        for dev, d in self.state["devices"].items():
            if d["cohort"] == key and d["result"] == rs.ROLLBACK_PENDING:
                self._publish_rollback(dev)
            elif d["cohort"] == key and d.get("desired_restored") is False:
                self._restore_desired(dev)
                d["desired_restored"] = True

    def _advance_rollback(self, key: str, statuses: dict[str, StatusDoc]) -> bool:
        cohort, now, changed = self.state["cohorts"][key], self.clock(), False
        for dev, d in self.state["devices"].items():
            if d["cohort"] != key or d["result"] != rs.ROLLBACK_PENDING:
                continue
            result, reason = self._rollback_outcome(d, statuses.get(dev))
            if result is None and now - cohort["rollback_started"] > self.spec.deadline_s:
                result, reason = rs.ROLLBACK_FAILED, f"no rollback confirmation within {self.spec.deadline_s:g} s"
            if result is not None:
                d.update(result=result, reason=reason, finished=now)
                self.progress("device", device_id=dev, cohort=key, result=result, reason=reason)
                changed = True
        if not any(d["cohort"] == key and d["result"] == rs.ROLLBACK_PENDING for d in self.state["devices"].values()):
            cohort["state"] = rs.HALTED
            changed = True
        return changed

    def _rollback_outcome(self, d: rs.DeviceRow, doc: StatusDoc | None) -> tuple[str | None, str | None]:
        prev, new, name = d["previous_version"], self.spec.version, self.spec.name
        if d.get("rollback_unavailable"):
            return rs.ROLLBACK_FAILED, d["rollback_unavailable"]
        if prev is None:
            if rs.holds(doc, name, new) or d.get("took"):
                return (
                    rs.ROLLBACK_FAILED,
                    f"no previous version to return to: {new} stays installed; desired state cleared",
                )
            return rs.CANCELLED, "cohort halted before it installed; desired state cleared"
        result, reason = rs.observe(doc, name, prev)
        if result == rs.FAILED:
            return rs.ROLLBACK_FAILED, f"rollback to {prev} failed: {reason}"
        if result in rs.TOOK and not rs.holds(doc, name, new):
            if d.get("took") or rs.held_before(doc, name, new):  # took it as the halt came, then went back
                return rs.ROLLED_BACK, f"rolled back to {prev} (cohort halted)"
            own, why = rs.observe(doc, name, new)  # in flight at the halt, its own try of the version may have failed
            if own == rs.FAILED:
                return (
                    rs.CANCELLED,
                    f"cohort halted while it tried {new}, which failed there too ({why}); stays on {prev}",
                )
            return rs.CANCELLED, f"cohort halted before it installed; stays on {prev}"
        return None, None

    # -- bookkeeping -----------------------------------------------------------------------------------------
    def _settle(self) -> bool:
        states = {c["state"] for c in self.state["cohorts"].values()}
        if not states <= {rs.COMPLETED, rs.HALTED}:
            return False
        final = rs.COMPLETED if states == {rs.COMPLETED} else rs.HALTED if states == {rs.HALTED} else rs.PARTIAL
        self.state["state"] = final
        self.progress(
            "rollout_finished", rollout_id=self.state["rollout_id"], state=final, counts=rs.totals(self.state)
        )
        return True

    def _publish_forward(self, dev: str) -> None:
        self.link.publish_desired(dev, self.spec.name, self.issuer.envelope(dev, self.spec.version, rollback=False))

    def _restore_desired(self, dev: str) -> None:
        """A device that never took the new version gets back exactly the desired state it had before the
        rollout (same bytes, so it sees nothing new and keeps serving); without a record, a signed rollback."""
        d = self.state["devices"][dev]
        if "previous_desired" not in d:
            return self._publish_rollback(dev)
        prev = d["previous_desired"]
        self.link.publish_desired(dev, self.spec.name, prev.encode() if prev else None)

    def _publish_rollback(self, dev: str) -> None:
        d = self.state["devices"][dev]
        env = None if d["previous_version"] is None else self.issuer.envelope(dev, d["previous_version"], rollback=True)
        if env is None and d["previous_version"] is not None:
            d["rollback_unavailable"] = (
                f"cannot sign a rollback to {d['previous_version']}: its artifact is not in "
                "the control plane's store; desired state cleared"
            )
        self.link.publish_desired(dev, self.spec.name, env)

    def _save(self) -> None:
        assert self.store is not None  # an engine built without a store overrides _save
        rs.save_state(self.store, self.state)
        self.link.publish_progress(self.state["rollout_id"], rs.progress_doc(self.state))
