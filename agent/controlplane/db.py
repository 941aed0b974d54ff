"""The database: engine for a URL (SQLite WAL by default, PostgreSQL via psycopg 3), migrations at start,
sessions, and the one mapping of storage faults (full disk, read-only) to a clear error."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from agent.controlplane import fleetcounts  # noqa: F401 - its session hooks keep fleet_counts with the devices
from agent.errors import ConfigError, EdgeAgentError

MIGRATIONS = Path(__file__).parent / "migrations"


class StorageError(EdgeAgentError):
    """The database refused a write (disk full, read-only, gone): the request fails, reads keep working."""


def _loads(text: str | bytes) -> Any:
    """A stored JSON value; one nested past what the parser can take (written straight into the database) reads as
    a string saying so, for the document checks to mark, never as an error that breaks a listing."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        return f"unreadable JSON: {type(exc).__name__}"


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, json_deserializer=_loads)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql+psycopg://"):
        return create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=8, json_deserializer=_loads)
    raise ConfigError(f"database.url: expected sqlite:///PATH or postgresql://..., got {url.split(':', 1)[0]}:...")


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (Alembic; the scripts ship as package data)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        serialize(conn, "migrate")  # replicas starting at once: one migrates, the others then find it done
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


LOCKS = {"migrate": 0x6561_6370_0001, "prepare": 0x6561_6370_0002}  # "eacp" and a number


def serialize(conn: Any, what: str) -> None:
    """On PostgreSQL, a transaction-scoped advisory lock: the same step of several replicas runs one at a time
    (held until the transaction ends). SQLite serializes writers by itself."""
    dialect = conn.get_bind().dialect if isinstance(conn, Session) else conn.dialect
    if dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCKS[what]})


def sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def storage_error(exc: OperationalError) -> StorageError:
    text = str(exc.orig) if exc.orig is not None else str(exc)
    low = text.lower()
    if "full" in low or "no space" in low:
        why = "the database's disk is full"
    elif "readonly" in low or "read-only" in low:
        why = "the database is read-only"
    else:
        why = "the database refused the write"
    return StorageError(f"{why}: {text.splitlines()[0]}; nothing was changed, reads keep working")


@contextlib.contextmanager
def write(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: committed at the end, rolled back on any error; storage faults become StorageError."""
    session = factory()
    try:
        yield session
        session.commit()
    except OperationalError as exc:
        session.rollback()
        raise storage_error(exc) from None
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
