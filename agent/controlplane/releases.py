"""Agent releases in the control plane (issue 40, `kind: agent`): uploaded as the wheelhouse `edge-agent release
build` writes, as a tar.gz (PUT /api/v1/releases/VERSION), verified against the fleet key before anything is
stored, kept in the content store and recorded as a version of the reserved artifact `edge-agent`
(agent.fleet.agent_release), so a rollout of `kind: agent` plans, signs, publishes, halts and rolls back exactly
as a model's. Each device's agent version and last trial are kept from its verified status (`note_status`), the
trial report's own signature checked against the device's key."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from sqlalchemy import select

from agent.controlplane import repo
from agent.controlplane.auth import Operator, need
from agent.controlplane.db import write
from agent.controlplane.models import Device, ModelVersion
from agent.controlplane.schemas import VERSION
from agent.errors import EdgeAgentError
from agent.fleet.agent_release import RELEASE_NAME, summary

router = APIRouter(prefix="/api/v1")
AsViewer = Annotated[Operator, Depends(need("viewer"))]
AsOperator = Annotated[Operator, Depends(need("operator"))]


class ReleaseRefused(EdgeAgentError):
    """An upload that is not a release signed by the fleet key (HTTP 422 at the edge)."""


def _fleet_public_key(ctx: Any) -> Any:
    from agent.artifacts.keys import load_private_key

    if ctx.settings.signing_key is None:
        raise ReleaseRefused("signing_key: the control plane has no fleet key to check the release's signature with")
    return load_private_key(ctx.settings.signing_key).public_key()


def save_release(ctx: Any, version: str, archive: Path, actor: str) -> dict[str, Any]:
    """Verify (signature, every wheel's sha256, the version), store, record (audited `release.upload`); the same
    bytes again are a no-op, other bytes for a version that exists a Conflict (409)."""
    import re

    from agent.artifacts.keys import key_id
    from agent.fleet.push import store_package
    from agent.release import manifest
    from agent.release.archive import unpack

    if not re.match(VERSION, version) or len(version) > 64:
        raise ReleaseRefused(f"version: {version[:80]!r} is not a dotted integer version")
    pub = _fleet_public_key(ctx)
    try:
        doc = manifest.verify(unpack(archive, archive.parent / "wheelhouse"), {key_id(pub): pub})
    except manifest.ReleaseRejected as exc:
        raise ReleaseRefused(str(exc)) from None
    if str(doc.get("version")) != version:
        raise ReleaseRefused(f"version: the release's manifest names {doc.get('version')!r}, not {version}")
    artifact = store_package(
        archive.rename(archive.with_name("release.tar.gz")), ctx.settings.uploads_dir, validate=False
    )
    with write(ctx.factory) as s:
        old = s.scalar(select(ModelVersion).where(ModelVersion.name == RELEASE_NAME, ModelVersion.version == version))
        if old is not None and old.sha256 != artifact["sha256"]:
            raise repo.Conflict(f"version: release {version} exists with other bytes; build a new version")
        if old is None:
            s.add(ModelVersion(name=RELEASE_NAME, version=version, sha256=artifact["sha256"], size=artifact["size"],
                               format=artifact["format"], created_at=time.time()))  # fmt: skip
            wheels = len(doc.get("wheels") or [])
            repo.audit(
                s, actor, "release.upload", f"{RELEASE_NAME}/{version}", sha256=artifact["sha256"], wheels=wheels
            )
    return {"kind": "agent", "version": version, "sha256": artifact["sha256"], "size": artifact["size"],
            "wheels": len(doc.get("wheels") or []), "dependencies": doc.get("dependencies")}  # fmt: skip


def release_shas(s: Any) -> dict[str, str]:
    """{version: sha256 of its archive} of every uploaded release."""
    rows = s.execute(select(ModelVersion.version, ModelVersion.sha256).where(ModelVersion.name == RELEASE_NAME))
    return {v: sha for v, sha in rows.all()}


def fill_shas(factory: Any, population: dict[str, Any]) -> dict[str, Any]:
    """A `kind: agent` rollout's population (statuses read through agent.fleet.agent_release.model_view) with
    each device's running release's archive sha256 taken from the uploads where it does not say it: the
    release a device came with (install.sh) can then be rolled back to."""
    with factory() as s:
        shas = release_shas(s)
    for doc in population.values():
        model = ((doc or {}).get("models") or {}).get(RELEASE_NAME) if isinstance(doc, dict) else None
        if isinstance(model, dict) and not model.get("sha256") and shas.get(str(model.get("version"))):
            model["sha256"] = shas[str(model["version"])]
    return population


def note_status(row: Device, doc: dict[str, Any]) -> None:
    """Keep the device's agent version and release summary from a verified status; its trial report's own
    signature is checked against the device's key once per new report (`verified`)."""
    version, release = summary(doc)
    row.agent_version = version
    trial = (release or {}).get("trial")
    if trial is not None:
        before = ((row.agent_release or {}).get("trial") or {}) if isinstance(row.agent_release, dict) else {}
        same = all(before.get(k) == trial.get(k) for k in ("version", "ended", "result", "signed"))
        trial["verified"] = before.get("verified", False) if same else _verified(row, doc)
    row.agent_release = release


def _verified(row: Device, doc: dict[str, Any]) -> bool:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    from agent.transport.signing import verify_doc

    report = (doc.get("agent_release") or {}).get("trial")
    if not isinstance(report, dict) or not row.public_key:
        return False
    try:
        return verify_doc(report, load_pem_public_key(row.public_key.encode())) == "verified"  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return False


@router.get("/releases", tags=["releases"])
def list_releases(request: Request, _: AsViewer) -> dict[str, Any]:
    with request.app.state.cp.factory() as s:
        rows = s.scalars(select(ModelVersion).where(ModelVersion.name == RELEASE_NAME).order_by(ModelVersion.id))
        return {"releases": [{"kind": "agent", "version": m.version, "sha256": m.sha256, "size": m.size,
                              "created_at": m.created_at} for m in rows.all()]}  # fmt: skip


@router.put("/releases/{version}", status_code=201, tags=["releases"])
async def upload_release(request: Request, version: str, op: AsOperator) -> dict[str, Any]:
    """The release's wheelhouse (release.json and its wheels, as `edge-agent release build` writes it) as a
    tar.gz in the request body; refused (422) unless signed by the fleet key with every wheel intact."""
    ctx = request.app.state.cp
    ctx.settings.uploads_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ctx.settings.uploads_dir) as tmp:
        path = Path(tmp) / "upload"
        with open(path, "wb") as f:
            async for chunk in request.stream():  # at most max_body_bytes: limits.BodyLimit cuts it off (413)
                f.write(chunk)
        return save_release(ctx, version, path, op.actor)
