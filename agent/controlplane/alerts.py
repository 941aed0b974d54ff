"""Alerts: conditions an operator must see, each kept as one row by its key and raised once until it clears
(so a webhook hears of it once): a halted rollout, a device whose latest deployment of a model was rolled back,
a device whose probation could not judge the version it runs ("not judged"), a device gone silent. Device
conditions are decided when its verified status is ingested (`on_status`, in the fleet loop's transaction);
rollouts and silence by `evaluate`, run every `alerts.check_s` by agent.controlplane.alert_monitor. Every query
is bounded (live or recent rollouts, at most `alerts.max_devices` devices per kind)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from agent.controlplane.models import ACCEPTED, Device, Rollout
from agent.controlplane.obs_tables import Alert, TelemetryHead
from agent.controlplane.observe_settings import AlertSettings
from agent.fleet import rollout_state as rs
from agent.fleet.outcome import UNJUDGED, device_outcome

HALTED, ROLLED_BACK, NOT_JUDGED, SILENT = "rollout_halted", "device_rolled_back", "device_not_judged", "device_silent"
KINDS = {
    HALTED: "halted rollout",
    ROLLED_BACK: "rolled-back device",
    NOT_JUDGED: "version not judged",
    SILENT: "device gone silent",
}
DEVICE_STATUS_KINDS = (ROLLED_BACK, NOT_JUDGED)
HALTED_STATES = ("halted", "partial", "rolling_back")
KEEP_CLEARED_S = 7 * 86400.0  # cleared alerts are listed this long, then deleted


def _short(text: Any, limit: int = 300) -> str:
    s = str(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


Condition = tuple[str, str, str, str, dict[str, Any]]  # key, kind, subject, message, detail


def device_conditions(device_id: str, status: Any) -> list[Condition]:
    """Rolled back and not judged, per model, from a device's verified status document."""
    if not isinstance(status, dict):
        return []
    out: list[Condition] = []
    deployments = _obj(status.get("deployments"))
    for model, dep in sorted(deployments.items()):
        if isinstance(dep, dict) and "rolled_back" in (dep.get("state"), dep.get("result")):
            why = _short(dep.get("reason") or "no reason given")
            msg = f"device {device_id} rolled back {model} {dep.get('version')}: {why}"
            detail = {"model": model, "version": _short(dep.get("version"), 64), "reason": why}
            out.append((f"{ROLLED_BACK}:{device_id}:{model}", ROLLED_BACK, device_id, msg, detail))
    models = _obj(status.get("models"))
    for model, m in sorted(models.items()):
        if not isinstance(m, dict) or not m.get("version"):
            continue
        result, why = device_outcome(status, model, str(m.get("version")))
        if result == UNJUDGED:
            msg = f"device {device_id} runs {model} {m.get('version')} {NOT_JUDGED_WORDS}: {_short(why)}"
            detail = {"model": model, "version": _short(m.get("version"), 64), "reason": _short(why)}
            out.append((f"{NOT_JUDGED}:{device_id}:{model}", NOT_JUDGED, device_id, msg, detail))
    return out


NOT_JUDGED_WORDS = "not judged (probation could not measure it)"


def _rollout_condition(row: Rollout) -> Condition | None:
    state = row.state or {}
    cohorts = _obj(state.get("cohorts"))
    halted_cohorts = [k for k, c in sorted(cohorts.items()) if isinstance(c, dict) and c.get("state") == "halted"]
    if not (row.paused or state.get("state") in HALTED_STATES or halted_cohorts):
        return None
    reasons = [str(cohorts[k].get("reason")) for k in halted_cohorts if cohorts[k].get("reason")]
    why = "halted by an operator" if row.paused else "; ".join(reasons) or str(state.get("state"))
    if row.rollback_requested:
        why += f"; {row.rollback_requested}"
    detail = {"model": row.spec.get("name"), "version": row.spec.get("version"), "state": state.get("state")}
    detail["halted_cohorts"] = halted_cohorts[:20]
    counts = rs.totals(state) if isinstance(state.get("devices"), dict) else {}
    detail["devices"] = counts  # by result: rolled_back, succeeded, not_reached...
    said = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)
    msg = f"rollout {row.rollout_id} halted: {_short(why)}" + (f" (devices: {said})" if said else "")
    return (f"{HALTED}:{row.rollout_id}", HALTED, row.rollout_id, msg, detail)


def rollout_conditions(s: Session, now: float, cfg: AlertSettings) -> list[Condition]:
    live = Rollout.phase.in_(("starting", "running"))
    rows = s.scalars(select(Rollout).where(or_(live, Rollout.updated_at >= now - cfg.recent_s)).limit(1000)).all()
    return [c for c in (_rollout_condition(r) for r in rows) if c is not None]


def silent_conditions(s: Session, now: float, cfg: AlertSettings) -> list[Condition]:
    """Accepted devices whose last status says offline (the broker's will or a stop) for `silent_s`, or whose
    health messages stopped `silent_s` ago."""
    cut = now - cfg.silent_s
    offline = s.execute(
        select(Device.device_id, Device.status_ts)
        .where(Device.state == ACCEPTED, Device.online.is_(False), Device.status_ts < cut)
        .order_by(Device.status_ts)
        .limit(cfg.max_devices)
    ).all()
    quiet = s.execute(
        select(TelemetryHead.device_id, TelemetryHead.heard_at)
        .join(Device, Device.device_id == TelemetryHead.device_id)
        .where(Device.state == ACCEPTED, TelemetryHead.heard_at < cut)
        .order_by(TelemetryHead.heard_at)
        .limit(cfg.max_devices)
    ).all()
    out: dict[str, Condition] = {}
    for dev, ts in quiet:
        msg = f"device {dev} gone silent: no health message for {now - ts:.0f} s"
        out[dev] = (f"{SILENT}:{dev}", SILENT, dev, msg, {"last_heard": ts, "why": "health stopped"})
    for dev, since in offline:
        msg = f"device {dev} gone silent: offline for {now - (since or now):.0f} s"
        out[dev] = (f"{SILENT}:{dev}", SILENT, dev, msg, {"last_heard": since, "why": "offline"})
    return list(out.values())


def _raise(s: Session, cond: Condition, now: float, webhook: bool) -> None:
    key, kind, subject, message, detail = cond
    row = s.get(Alert, key)
    if row is not None and row.cleared_at is None:
        row.seen_at, row.message, row.detail = now, message, detail  # still true: updated, not raised again
        return
    if row is None:
        row = Alert(key=key, kind=kind, subject=subject[:160])
        s.add(row)
    row.message, row.detail, row.raised_at, row.seen_at, row.cleared_at = message, detail, now, now, None
    row.send_state, row.attempts, row.sent_at, row.send_error = ("pending" if webhook else "none"), 0, None, None


def _clear(row: Alert, now: float) -> None:
    row.cleared_at = now
    if row.send_state == "pending":
        row.send_state = "unsent"  # cleared before it could be sent


def apply(s: Session, conds: Iterable[Condition], active: Iterable[Alert], now: float, cfg: AlertSettings) -> None:
    """Raise what is true and not active, clear what is active and no longer true."""
    true = {c[0]: c for c in conds}
    for row in active:
        if row.key not in true:
            _clear(row, now)
    for cond in true.values():
        _raise(s, cond, now, cfg.webhook.url is not None)


def on_status(s: Session, device_id: str, status: Any, now: float, cfg: AlertSettings, active: list[Alert]) -> None:
    """A device's verified status was stored: its rolled-back and not-judged alerts follow it (`active`: its
    active ones, as `active_device_alerts` read them)."""
    apply(s, device_conditions(device_id, status), active, now, cfg)


def active_device_alerts(s: Session, device_ids: list[str]) -> dict[str, list[Alert]]:
    """{device: its active rolled-back and not-judged alerts} for these devices: one query per 500 (an intake
    batch reads them once, not once per status)."""
    out: dict[str, list[Alert]] = {}
    for i in range(0, len(device_ids), 500):
        stmt = select(Alert).where(
            Alert.subject.in_(device_ids[i : i + 500]),
            Alert.kind.in_(DEVICE_STATUS_KINDS),
            Alert.cleared_at.is_(None),
        )
        for row in s.scalars(stmt).all():
            out.setdefault(row.subject, []).append(row)
    return out


def evaluate(s: Session, now: float, cfg: AlertSettings) -> None:
    """Rollout and silence alerts raised and cleared; device alerts of devices no longer accepted cleared."""
    for kind, conds in ((HALTED, rollout_conditions(s, now, cfg)), (SILENT, silent_conditions(s, now, cfg))):
        active = list(s.scalars(select(Alert).where(Alert.kind == kind, Alert.cleared_at.is_(None))).all())
        if kind == SILENT:  # a device still offline stays silent, whatever the timer says (a restart resets it)
            keep = {c[0] for c in conds}
            lapsed = [a for a in active if a.key not in keep]
            still = _offline([a.subject for a in lapsed], s)
            conds = conds + [(a.key, a.kind, a.subject, a.message, a.detail) for a in lapsed if a.subject in still]
        apply(s, conds, active, now, cfg)
    accepted = select(Device.device_id).where(Device.state == ACCEPTED)
    gone = s.scalars(
        select(Alert).where(
            Alert.kind.in_((*DEVICE_STATUS_KINDS, SILENT)),
            Alert.cleared_at.is_(None),
            Alert.subject.not_in(accepted),
        )
    ).all()
    for row in gone:
        _clear(row, now)
    s.execute(delete(Alert).where(Alert.cleared_at < now - KEEP_CLEARED_S))


def _offline(subjects: list[str], s: Session) -> set[str]:
    if not subjects:
        return set()
    rows = s.scalars(
        select(Device.device_id).where(Device.device_id.in_(list(subjects)), Device.online.is_(False))
    ).all()
    return set(rows)


def active_count(s: Session) -> int:
    return int(s.scalar(select(func.count()).select_from(Alert).where(Alert.cleared_at.is_(None))) or 0)


def listing(s: Session, active: bool, limit: int = 200) -> list[Alert]:
    stmt = select(Alert)
    if active:
        stmt = stmt.where(Alert.cleared_at.is_(None)).order_by(Alert.raised_at.desc())
    else:
        stmt = stmt.where(Alert.cleared_at.is_not(None)).order_by(Alert.cleared_at.desc())
    return list(s.scalars(stmt.limit(limit)).all())


def alert_dict(a: Alert) -> dict[str, Any]:
    return {
        "key": a.key,
        "kind": a.kind,
        "what": KINDS.get(a.kind, a.kind),
        "subject": a.subject,
        "message": a.message,
        "detail": a.detail,
        "raised_at": a.raised_at,
        "seen_at": a.seen_at,
        "cleared_at": a.cleared_at,
        "webhook": {"state": a.send_state, "attempts": a.attempts, "sent_at": a.sent_at, "error": a.send_error},
    }
