"""The overview's counts kept as devices change: fleet_counts holds how many devices share each combination of
the columns the overview groups by (state, target, provider, precision, model versions, model state, online),
changed in the same transaction as the devices rows (session hooks: a changed device's columns read under a row
lock before the transaction's first flush that changes it, read again at commit, the difference added). The overview sums these few rows; no page
view scans the devices table, whatever the fleet's size."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, event, func, inspect, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from agent.controlplane.models import Device, FleetCount

KEY = ("state", "target", "provider", "precision", "model_versions", "model_state", "online")
CHUNK = 500
_BEFORE = "fleetcounts.before"  # session.info: {device_id: its columns when this transaction first changed it}


def key_hash(values: Iterable[Any]) -> str:
    """fleet_counts' primary key for one combination (migration 0009 computes the same)."""
    return hashlib.sha256(json.dumps(list(values)).encode()).hexdigest()


def _touched(session: Session) -> set[str]:
    ids = {o.device_id for o in (*session.new, *session.deleted) if isinstance(o, Device)}
    for o in session.dirty:
        if isinstance(o, Device):
            attrs = inspect(o).attrs
            if any(attrs[k].history.has_changes() for k in KEY):
                ids.add(o.device_id)
    return {i for i in ids if i is not None}


_READS: dict[bool, Any] = {}  # lock -> the columns' select, built once (device ids bound as a list)


def _reader(lock: bool) -> Any:
    if lock not in _READS:
        t = Device.__table__
        stmt = select(t.c.device_id, *(t.c[k] for k in KEY)).where(t.c.device_id.in_(bindparam("ids", expanding=True)))
        if lock:  # nobody else changes these rows until this transaction ends (PostgreSQL; SQLite has one writer)
            stmt = stmt.order_by(t.c.device_id).with_for_update()
        _READS[lock] = stmt
    return _READS[lock]


def _read(conn: Connection, ids: list[str], lock: bool) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for i in range(0, len(ids), CHUNK):
        got = conn.execute(_reader(lock), {"ids": ids[i : i + CHUNK]})
        out.update({r[0]: tuple(r[1:-1]) + (bool(r[-1]),) for r in got})
    return out


def _created(session: Session) -> set[str]:
    """Devices this flush inserts that had no row (pending, and no row of the same id deleted in this flush)."""
    gone = {o.device_id for o in session.deleted if isinstance(o, Device)}
    new = {o.device_id for o in session.new if isinstance(o, Device)}
    return {i for i in new if i is not None and i not in gone}


def before_flush(session: Session) -> None:
    """Devices this flush changes that the transaction had not changed yet: their columns as they are now,
    row-locked (one query per 500, whatever the number of flushes; an intake batch flushes once). A device this
    flush inserts had none (nothing to read: an enrollment's insert costs no query here)."""
    ids = _touched(session)
    before: dict[str, tuple | None] = session.info.setdefault(_BEFORE, {})
    created = _created(session) - before.keys()
    before.update(dict.fromkeys(created))
    fresh = sorted(ids - before.keys())
    if fresh:
        got = _read(session.connection(), fresh, lock=True)
        before.update({i: got.get(i) for i in fresh})


def before_commit(session: Session) -> None:
    """The last flush, then each changed device's columns read again and the difference added, once per
    transaction (in it: the counts commit with the rows or not at all)."""
    session.flush()  # what commit would flush next: its devices' columns are read before it, by before_flush
    before: dict[str, tuple | None] = session.info.pop(_BEFORE, {})
    if not before:
        return
    conn = session.connection()
    after = _read(conn, sorted(before), lock=False)
    delta: Counter[tuple] = Counter()
    for dev, old in before.items():
        if old is not None:
            delta[old] -= 1
        if (new := after.get(dev)) is not None:
            delta[new] += 1
    add(conn, {k: n for k, n in delta.items() if n})


def forget(session: Session) -> None:
    """The transaction rolled back: what it had read goes with it."""
    session.info.pop(_BEFORE, None)


_UPSERTS: dict[str, Any] = {}  # dialect name -> the count's upsert, built once (bound by name)


def _upsert(dialect: str) -> Any:
    if dialect not in _UPSERTS:
        t = cast(Table, FleetCount.__table__)
        ins = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(t)
        _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=[t.c.key], set_={"devices": t.c.devices + ins.excluded.devices}
        )
    return _UPSERTS[dialect]


def add(conn: Connection, delta: dict[tuple, int]) -> None:
    """Add `delta` ({combination: devices}) to fleet_counts, in key order (two writers lock rows in one order);
    a combination no device has any more is removed."""
    t = cast(Table, FleetCount.__table__)
    keyed = sorted((key_hash(k), k, n) for k, n in delta.items())
    for h, k, n in keyed:
        conn.execute(_upsert(conn.dialect.name), {"key": h, "devices": n, **dict(zip(KEY, k))})
    if any(n < 0 for _, _, n in keyed):
        gone = [h for h, _, n in keyed if n < 0]
        conn.execute(delete(t).where(t.c.key.in_(gone), t.c.devices <= 0))


def recount(session: Session) -> dict[tuple, int]:
    """{combination: devices} counted from the devices table (what fleet_counts must equal; tests and repair)."""
    t = Device.__table__
    cols = [t.c[k] for k in KEY]
    rows = session.execute(select(*cols, func.count()).group_by(*cols)).all()
    out: Counter[tuple] = Counter()
    for r in rows:
        out[tuple(r[:-2]) + (bool(r[-2]),)] += int(r[-1])
    return dict(out)


def kept(session: Session) -> dict[tuple, int]:
    """{combination: devices} as fleet_counts holds them."""
    t = FleetCount.__table__
    rows = session.execute(select(*(t.c[k] for k in KEY), t.c.devices).where(t.c.devices != 0)).all()
    return {tuple(r[:-2]) + (bool(r[-2]),): int(r[-1]) for r in rows}


@event.listens_for(Session, "before_flush")
def _on_flush(session: Session, _ctx: Any, _objects: Any) -> None:
    before_flush(session)


@event.listens_for(Session, "before_commit")
def _on_commit(session: Session) -> None:
    before_commit(session)


@event.listens_for(Session, "after_rollback")
def _on_rollback(session: Session) -> None:
    forget(session)
