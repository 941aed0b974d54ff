"""The device list's filters and groups: the columns (state, group, hardware class, provider) filter in SQL as
bound parameters (repo.list_devices); what only the device's last verified status says (model and version,
precision, health) filters in Python over the devices those leave, each status checked again as read
(repo.device_dict), then the page is cut. Each listed device carries, per model it serves, the reason its
provider was chosen (the newest decision record of that version), so the list shows the "why" too."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.controlplane import repo
from agent.controlplane.models import DeviceDocument

HEALTH = ("healthy", "on probation", "degraded", "offline", "no status")
GROUP_BY = {
    "model": "model version",
    "precision": "precision",
    "provider": "provider",
    "health": "health",
    "target": "hardware class",
}
SERVING = {"committed", "stale", "probation", "activating"}
NOT_REPORTED = "not reported"


TEXT = Field("", max_length=64)


class DeviceQuery(BaseModel):
    """What the device list was asked for (every field a query parameter; "" means any)."""

    model_config = ConfigDict(frozen=True)

    state: str = Field("accepted", max_length=16)
    group: str = TEXT
    target: str = TEXT
    provider: str = TEXT
    model: str = TEXT
    version: str = TEXT
    precision: str = TEXT
    health: str = TEXT
    group_by: str = TEXT

    def params(self, **change: Any) -> dict[str, Any]:
        """The query parameters of this listing (with `change`), as links carry them ("" left out, but state:
        "" means any state, where leaving it out means accepted)."""
        return {k: v for k, v in {**self.model_dump(), **change}.items() if v or k == "state"}

    @property
    def by_status(self) -> bool:
        return bool(self.model or self.version or self.precision or self.health or self.group_by)


def health(dev: dict[str, Any]) -> tuple[str, str]:
    """(one of HEALTH, why in words) from the device's last verified status."""
    if not dev.get("status_ts"):
        return "no status", "no verified status received"
    if not dev.get("online"):
        return "offline", "its last verified status says offline (or its will was published)"
    models = _served(dev)
    bad = [(m, v) for m, v in models if v.get("state") not in SERVING]
    if bad:
        return "degraded", "; ".join(
            f"{m}: {v.get('state')}" + (f" ({v['reason']})" if v.get("reason") else "") for m, v in bad
        )
    trial = [m for m, v in models if v.get("state") in ("probation", "activating")]
    if trial:
        return "on probation", ", ".join(trial) + " not committed yet"
    return "healthy", "online, every model serving" if models else "online, no model deployed"


def _served(dev: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return sorted((m, v) for m, v in (dev.get("models") or {}).items() if isinstance(v, dict))


def precisions(dev: dict[str, Any]) -> str:
    return ", ".join(sorted({str(v["precision"]) for _, v in _served(dev) if v.get("precision")})) or NOT_REPORTED


def group_key(dev: dict[str, Any], by: str) -> str:
    """The value a device is grouped under."""
    if by == "model":
        return ", ".join(f"{m} {v.get('version')}" for m, v in _served(dev)) or "no model"
    if by == "precision":
        return precisions(dev)
    if by == "health":
        return health(dev)[0]
    if by == "provider":
        return dev.get("provider") or NOT_REPORTED
    return dev.get("target") or NOT_REPORTED


def group_filter(by: str, key: str) -> dict[str, str] | None:
    """The filter that lists one group's devices (None when no single filter does: several models, no model)."""
    if by == "model":
        name, _, version = key.partition(" ")
        return {"model": name, "version": version} if version and "," not in key else None
    if key == NOT_REPORTED:
        return None
    return {by: key}


def matches(dev: dict[str, Any], q: DeviceQuery) -> bool:
    """The status filters: a model (and version) it serves, a precision one of its models runs at, its health."""
    served = _served(dev)
    if q.model or q.version:
        want_model, want_version = q.model, q.version
        if not any(
            (not want_model or m == want_model) and (not want_version or v.get("version") == want_version)
            for m, v in served
        ):
            return False
    if q.precision and q.precision != precisions(dev) and all(v.get("precision") != q.precision for _, v in served):
        return False
    return not q.health or health(dev)[0] == q.health


def whys(session: Session, devices: list[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(device, model, version) -> the reason its provider was chosen, from the newest decision record of that
    version each listed device uploaded (checked again as read: repo.documents)."""
    ids = [d["device_id"] for d in devices]
    if not ids:
        return {}
    stmt = (
        select(DeviceDocument.device_id, DeviceDocument.model, DeviceDocument.version, DeviceDocument.id)
        .where(DeviceDocument.device_id.in_(ids), DeviceDocument.kind == "decision")
        .order_by(DeviceDocument.ts.desc(), DeviceDocument.id.desc())
    )
    newest: dict[tuple[str, str, str], int] = {}
    for dev, model, version, doc_id in session.execute(stmt).all():
        newest.setdefault((dev, model or "", version or ""), doc_id)
    out: dict[tuple[str, str, str], str] = {}
    from agent.controlplane.docschema import clean

    for key, doc_id in newest.items():
        row = session.get(DeviceDocument, doc_id)
        decision = clean("decision", row.doc).get("decision") if row is not None else None
        reason = decision.get("reason") if isinstance(decision, dict) else None
        if isinstance(reason, str) and reason:
            out[key] = reason
    return out


def _by_columns(
    session: Session, q: DeviceQuery, offset: int, limit: int | None, after: str | None = None
) -> tuple[int, list[Any]]:
    return repo.list_devices(
        session,
        state=q.state or None,
        group=q.group or None,
        target=q.target or None,
        provider=q.provider or None,
        offset=offset,
        limit=limit,
        after=after,
    )


def listing(session: Session, q: DeviceQuery, offset: int, limit: int, after: str | None = None) -> dict[str, Any]:
    """{"total", "devices" (the page, each with "health" and per model "why"), "groups" (each value with its
    count over every device the filters leave, when grouped, and the filter that lists them), "next" (the
    cursor behind this page's last device, None on the last page or when filtered by status: numbered pages)}.
    `after`: a device id (repo.after_id), the page starts behind it (filters by column only)."""
    groups: dict[str, int] = {}
    nxt = None
    if not q.by_status:
        total, rows = _by_columns(session, q, offset, limit + 1, after)
        if len(rows) > limit:
            rows, nxt = rows[:limit], repo.cursor(rows[limit - 1].device_id)
        items = [repo.device_dict(r) for r in rows]
    else:
        every = [d for d in (repo.device_dict(r) for r in _by_columns(session, q, 0, None)[1]) if matches(d, q)]
        if q.group_by in GROUP_BY:
            every.sort(key=lambda d: (group_key(d, q.group_by), d["device_id"]))
            for d in every:
                key = group_key(d, q.group_by)
                groups[key] = groups.get(key, 0) + 1
        total, items = len(every), every[offset : offset + limit]
    reasons = whys(session, items)
    for d in items:
        d["health"], d["health_why"] = health(d)
        d["group_key"] = group_key(d, q.group_by) if q.group_by in GROUP_BY else ""
        d["models"] = {m: {**v, "why": reasons.get((d["device_id"], m, str(v.get("version"))))} for m, v in _served(d)}
    summary = [{"key": k, "devices": n, "filter": group_filter(q.group_by, k)} for k, n in groups.items()]
    return {"total": total, "devices": items, "groups": summary, "next": nxt}
