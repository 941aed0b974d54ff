"""Desired-state publications recorded before they are made, so none is made twice: the rollout engine's link
wrapped so that each desired state for a device, in one rollout and round (the roll back request it answers, ""
on the forward path; a device is in one wave), by the SHA-256 of its bytes, is written to `desired_publications`
(in the leader's fenced transaction: a stale leader's publication is refused before it reaches the broker), then
published (retained, QoS 1), then marked sent once the broker acknowledged it. A leader that takes over resumes
every rollout and republishes only what was recorded but never acknowledged (a crash between the broker's
PUBACK and the mark: the same bytes again, which a device treats as nothing new)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agent.controlplane.db import write
from agent.controlplane.shared_models import LeaderLease, Publication

log = logging.getLogger("edge_agent.controlplane")
ACK_WAIT_S = 10.0


class LedgerLink:
    """The engine's link (agent.fleet.rollout_link.FleetLink) with publish_desired going through the ledger;
    everything else is the link's own."""

    def __init__(self, link, factory: sessionmaker[Session], rollout_id: str, round_of: Callable[[], str | None]):
        self.link, self.factory, self.rollout_id, self.round_of = link, factory, rollout_id, round_of
        self.skipped = 0  # publications found sent already (a resumed rollout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.link, name)

    def publish_desired(self, device_id: str, model: str, envelope: bytes | None) -> None:
        key = {
            "rollout_id": self.rollout_id,
            "round": (self.round_of() or "")[:160],
            "device_id": device_id,
            "digest": _digest(envelope),
        }
        with write(self.factory) as s:
            row = s.get(Publication, key)
            if row is not None and row.sent_at is not None:
                self.skipped += 1
                return  # this very desired state went out already in this rollout and round
            if row is None:
                fence = s.scalar(select(LeaderLease.fence).where(LeaderLease.name == "fleet")) or 0
                s.add(Publication(**key, fence=fence, sent_at=None))
        info = self.link.publish_desired(device_id, model, envelope)
        if _acknowledged(info, device_id):
            with write(self.factory) as s:
                row = s.get(Publication, key)
                if row is not None:
                    row.sent_at = time.time()


def _digest(envelope: Any) -> str:
    payload = envelope or b""
    if not isinstance(payload, bytes):  # a link of another kind may carry documents, not bytes
        payload = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(payload).hexdigest()


def _acknowledged(info: Any, device_id: str) -> bool:
    """The broker's PUBACK came (a link that returns no MessageInfo has delivered when it returns)."""
    if info is None or not hasattr(info, "wait_for_publish"):
        return True
    try:
        info.wait_for_publish(timeout=ACK_WAIT_S)
    except (RuntimeError, ValueError) as exc:
        log.warning("desired state for %s: not acknowledged (%s); republished at the next resume", device_id, exc)
        return False
    return bool(info.is_published())


def sent(factory: sessionmaker[Session], rollout_id: str) -> dict[str, int]:
    """Publications of one rollout per device (acknowledged ones), for tests and the API."""
    with factory() as s:
        rows = s.execute(
            select(Publication.device_id).where(Publication.rollout_id == rollout_id, Publication.sent_at.is_not(None))
        ).all()
    out: dict[str, int] = {}
    for (dev,) in rows:
        out[dev] = out.get(dev, 0) + 1
    return out
