"""First start: an existing STORE/registry.json and STORE/rollouts/*.json come into the database (once; the
files stay where they are), so users of the `fleet` CLI lose nothing."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agent.controlplane import repo
from agent.controlplane.models import ACCEPTED, Device, Rollout
from agent.fleet import rollout_state as rs
from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry


def import_store(session: Session, store: Path) -> dict[str, int]:
    """Only into an empty database. Registered devices arrive accepted (an operator registered them)."""
    if (session.scalar(select(func.count()).select_from(Device)) or 0) > 0:
        return {"devices": 0, "rollouts": 0}
    if (session.scalar(select(func.count()).select_from(Rollout)) or 0) > 0:
        return {"devices": 0, "rollouts": 0}
    devices = rollouts = 0
    now = time.time()
    path = store / REGISTRY_NAME
    if path.exists():
        registry = DeviceRegistry.load(path)
        seen_keys: set[str] = set()
        for dev, entry in sorted(registry.devices.items()):
            kid = str(entry.get("key_id"))
            if kid in seen_keys:
                repo.audit(session, "import", "import.skipped", dev, reason=f"key {kid} already held by another device")
                continue
            seen_keys.add(kid)
            row = Device(
                device_id=dev,
                state=ACCEPTED,
                public_key=entry["public_key"],
                key_id=kid,
                groups=[],
                online=False,
                hardware={},
                requested_at=now,
                decided_at=now,
                decided_by="import",
            )
            session.add(row)
            session.flush()
            repo.set_groups(session, row, list(entry.get("groups") or []))
            devices += 1
    for state in rs.list_states(store):
        final = state["state"] in rs.ROLLOUT_FINAL
        session.add(
            Rollout(
                rollout_id=state["rollout_id"],
                spec=state["spec"],
                knobs={},
                phase="finished" if final else "running",
                paused=False,
                state=state,
                created_by="import",
                created_at=state.get("created") or now,
                updated_at=now,
            )
        )
        rollouts += 1
    if devices or rollouts:
        repo.audit(session, "import", "import.store", str(store), devices=devices, rollouts=rollouts)
    return {"devices": devices, "rollouts": rollouts}
