"""Freshness of signed device documents (decision records, conformance reports; docs/control-plane.md,
"Freshness of signed documents").

A device signs each document with `seq` (its own counter, agent.transport.docseq: durable, never goes back) and
`ts` (when it signed), both under the signature. Per device and kind of document the service keeps the highest
`seq` it stored (DocumentMark, with the key it came under) and, before anything is stored:
- the exact same signed document again is a duplicate: answered with the row it made, nothing stored;
- a `seq` below the mark, or equal to it with other content, is Stale (409);
- a `ts` more than FUTURE_SKEW_S ahead of the service's clock, or a malformed `seq`/`ts`, is BadStamp (422);
- a document without `seq` (a device from before the field) is taken only while that device has never sent a
  sequenced document of that kind; after one, it is Stale (409).
A new key under the same device id (decommissioned, then enrolled again) starts a new mark.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.controlplane.models import Device, DocumentMark
from agent.controlplane.repo import Conflict
from agent.errors import EdgeAgentError

FUTURE_SKEW_S = 300.0  # a signed `ts` may be this far ahead of the service's clock (the enrollment's allowance)
MAX_SEQ = 2**62  # fits the BIGINT column with room; a device counting once a millisecond needs 10^8 years


class Stale(Conflict):
    """Older than (or equal to, with other content) what the device already sent: HTTP 409, nothing stored."""


class BadStamp(EdgeAgentError):
    """`seq` or `ts` malformed, or `ts` too far in the future: HTTP 422, nothing stored."""


def digest(doc: dict[str, Any]) -> str:
    """sha256 of the signed document as JSON with sorted keys (signature included): equal iff the same document."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def stamp(doc: dict[str, Any], now: float) -> tuple[int | None, float | None]:
    """The document's (seq, ts), checked: BadStamp names the field."""
    seq, ts = doc.get("seq"), doc.get("ts")
    if seq is not None and (type(seq) is not int or not 0 < seq <= MAX_SEQ):
        raise BadStamp(f"seq: expected an integer from 1 to 2^62, got {str(seq)[:40]!r}")
    if ts is not None and (type(ts) not in (int, float) or not math.isfinite(ts)):
        raise BadStamp(f"ts: expected seconds since the epoch, got {str(ts)[:40]!r}")
    if seq is not None and ts is None:
        raise BadStamp("ts: required with seq (the signing time)")
    if ts is not None and ts > now + FUTURE_SKEW_S:
        raise BadStamp(
            f"ts: {ts:.0f} is {ts - now:.0f} s ahead of the service's clock (at most {FUTURE_SKEW_S:.0f} s allowed)"
        )
    return seq, (float(ts) if ts is not None else None)


def lock(session: Session, device: Device, kind: str) -> DocumentMark | None:
    """The device's mark for `kind`, locked for this transaction (PostgreSQL: FOR UPDATE; SQLite: one writer):
    taken before the device's stored documents are read, so two posts of one device are judged one after the
    other."""
    stmt = select(DocumentMark).where(DocumentMark.device_id == device.device_id, DocumentMark.kind == kind)
    return session.scalars(stmt.with_for_update()).first()


def check(device: Device, kind: str, seq: int | None, mark: DocumentMark | None) -> None:
    """Stale unless `seq` is above the device's mark for `kind` (`lock`'s; see the module's rules). A duplicate is
    answered before this (agent.controlplane.documents)."""
    live = mark if mark is not None and mark.key_id == device.key_id else None
    if live is None:
        return
    who = f"{device.device_id}'s {kind} documents"
    if seq is None:
        raise Stale(f"seq: missing; {who} carry a seq (highest seen {live.seq}): an unsequenced one is refused")
    if seq < live.seq:
        raise Stale(f"seq: {seq} is older than {who} already stored (highest seen {live.seq}): a replay, refused")
    if seq == live.seq:
        raise Stale(f"seq: {seq} was already signed for another of {who} (highest seen {live.seq}): refused")


def advance(session: Session, device: Device, kind: str, doc: tuple[int | None, str, float | None], now: float,
            mark: DocumentMark | None) -> None:  # fmt: skip
    """Raise the mark to the document's (seq, digest, ts): `mark` is lock()'s, passed by check() (the seq is above
    it, or it is of an older key; None: the device has none yet, a row is added)."""
    seq, sha, ts = doc
    if seq is None:
        return
    if mark is None:
        session.add(
            DocumentMark(
                device_id=device.device_id,
                kind=kind,
                key_id=device.key_id,
                seq=seq,
                digest=sha,
                signed_ts=ts,
                received=now,
            )
        )
        return
    mark.key_id, mark.seq, mark.digest, mark.signed_ts, mark.received = device.key_id, seq, sha, ts, now
