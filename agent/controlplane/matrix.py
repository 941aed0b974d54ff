"""The fleet evidence matrix: model version x hardware class -> the provider and precision the devices chose,
their p50/p99 and accuracy, how many devices, how many verdicts were not judged. Each stored decision record is
reduced to one typed row per device and model version (`evidence_rows`, written when the record is stored), so
the matrix is one GROUP BY on indexed columns joined with the devices' hardware class, never a read of the
records themselves."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Integer, Table, case, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from agent.controlplane.models import ACCEPTED, Device, DeviceDocument
from agent.controlplane.obs_tables import EvidenceRow
from agent.controlplane.telemetry_intake import num

MAX_GROUPS = 5000  # (model, version, class, provider, precision) groups read at most
NOT_JUDGED = "not judged"


def _text(value: Any, limit: int) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _selected_row(decision: dict[str, Any], selected: str | None) -> dict[str, Any]:
    rows = decision.get("results")
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and selected and selected in (row.get("key"), row.get("provider")):
            return row
    return {}


def _not_judged(doc: dict[str, Any]) -> bool:
    pr = doc.get("probation")
    if isinstance(pr, dict) and isinstance(pr.get("not_judged"), dict):
        return True
    atts = _obj(doc.get("attestations"))
    trial = _obj(atts.get("trial"))
    summary = _obj(trial.get("summary"))
    return bool(trial.get("verified")) and summary.get("verdict") == NOT_JUDGED


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """What the matrix keeps of a decision record (every figure checked: out of range is not measured)."""
    decision = _obj(doc.get("decision"))
    provider = _text(decision.get("selected"), 64)
    row = _selected_row(decision, provider)
    lat = _obj(row.get("latency_ms"))
    acc = _obj(row.get("accuracy"))
    precision = _text(decision.get("selected_precision"), 32) or _text(row.get("precision"), 32)
    return {
        "provider": provider,
        "precision": precision,
        "p50_ms": num(lat.get("p50"), 0, 1e7),
        "p99_ms": num(lat.get("p99"), 0, 1e7),
        "max_rel": num(acc.get("max_rel"), 0, 1e30),
        "not_judged": _not_judged(doc),
    }


_KEY = ("device_id", "model", "version")
_UPSERTS: dict[str, Any] = {}  # dialect name -> the evidence row's upsert, built once (bound by name)


def _upsert(dialect: str) -> Any:
    if dialect not in _UPSERTS:
        t = cast(Table, EvidenceRow.__table__)
        ins = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(t)
        _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=[t.c[k] for k in _KEY],
            set_={c.name: ins.excluded[c.name] for c in t.c if c.name not in _KEY},
            where=t.c.ts <= ins.excluded.ts,  # a newer record kept already stays
        ).returning(t.c.doc_id)
    return _UPSERTS[dialect]


def record(s: Session, row: DeviceDocument) -> bool:
    """Keep the evidence row of a stored decision record (the newest record of a device's version wins); False
    when the record says nothing the matrix keeps (not an object) or a newer one is kept already. One upsert (the
    record's own row flushed first for its id), never a read of the evidence row: this runs for every record."""
    if row.kind != "decision" or not row.model or not row.version or not isinstance(row.doc, dict):
        return False
    if row.id is None:
        s.flush()
    values = {"device_id": row.device_id, "model": row.model, "version": row.version, "doc_id": row.id,
              "ts": row.ts, **figures(row.doc)}  # fmt: skip
    return s.execute(_upsert(s.get_bind().dialect.name), values).first() is not None


def backfill(s: Session, limit: int = 500) -> int:
    """Evidence rows for decision records stored before this table existed: how many this batch made (0: none is
    missing, or none of the rest can make one)."""
    e = EvidenceRow
    missing = (
        select(DeviceDocument)
        .outerjoin(
            e,
            (e.device_id == DeviceDocument.device_id)
            & (e.model == DeviceDocument.model)
            & (e.version == DeviceDocument.version),
        )
        .where(DeviceDocument.kind == "decision", DeviceDocument.model.is_not(None), e.device_id.is_(None))
        .where(DeviceDocument.version.is_not(None))
        .order_by(DeviceDocument.ts.desc())
        .limit(limit)
    )
    made = 0
    for row in s.scalars(missing).all():
        made += record(s, row)
        s.flush()
    return made


def _groups(s: Session) -> list[Any]:
    e = EvidenceRow
    stmt = (
        select(
            e.model,
            e.version,
            Device.target,
            e.provider,
            e.precision,
            func.count(),
            func.avg(e.p50_ms),
            func.max(e.p50_ms),
            func.avg(e.p99_ms),
            func.max(e.p99_ms),
            func.max(e.max_rel),
            func.sum(case((e.not_judged.is_(True), 1), else_=0).cast(Integer)),
        )
        .join(Device, Device.device_id == e.device_id)
        .where(Device.state == ACCEPTED)
        .group_by(e.model, e.version, Device.target, e.provider, e.precision)
        .order_by(e.model, e.version, Device.target, func.count().desc())
        .limit(MAX_GROUPS)
    )
    return list(s.execute(stmt).all())


def matrix(s: Session) -> dict[str, Any]:
    """{"classes": [...], "rows": [{"model", "version", "cells": {class: cell}}], "truncated"}; a cell holds
    `choices` (provider, precision, devices, p50/p99 mean and worst, worst max_rel, not judged), `devices` and
    `not_judged` in all."""
    groups = _groups(s)
    classes: set[str] = set()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for model, version, target, provider, precision, n, p50, p50_max, p99, p99_max, rel, nj in groups:
        cls = target or ""  # shown as "unknown": no class reported
        classes.add(cls)
        row = rows.setdefault((model, version), {"model": model, "version": version, "cells": {}})
        cell = row["cells"].setdefault(cls, {"devices": 0, "not_judged": 0, "choices": []})
        cell["devices"] += int(n)
        cell["not_judged"] += int(nj or 0)
        cell["choices"].append(
            {
                "provider": provider,
                "precision": precision,
                "devices": int(n),
                "p50_ms": p50,
                "p50_ms_worst": p50_max,
                "p99_ms": p99,
                "p99_ms_worst": p99_max,
                "max_rel_worst": rel,
                "not_judged": int(nj or 0),
            }
        )
    return {
        "classes": sorted(classes),
        "rows": [rows[k] for k in sorted(rows)],
        "truncated": len(groups) >= MAX_GROUPS,
    }


def cell_devices(s: Session, model: str, version: str, target: str | None, offset: int, limit: int) -> list[Any]:
    """The evidence rows behind one cell (target None: devices of no known class), newest first."""
    e = EvidenceRow
    stmt = (
        select(e, Device.target)
        .join(Device, Device.device_id == e.device_id)
        .where(Device.state == ACCEPTED, e.model == model, e.version == version)
        .where(Device.target.is_(None) if target is None else Device.target == target)
        .order_by(e.device_id)
        .offset(offset)
        .limit(limit)
    )
    return list(s.execute(stmt).all())
