"""The dashboard's model versions: the list, the upload form (a package file posted from the browser, checked
with the rules of `edge-agent package --check` and stored as the API's upload is: agent.controlplane.packages),
and a version's page with the form that starts its rollout (posted to /rollouts, as the rollouts page's is) and
the one that pushes it at once, without canary or waves, to chosen devices, a group or every accepted device of a
hardware class (POST /api/v1/push's code: agent.controlplane.pushes).

The upload's body is capped like the API's (max_body_bytes: limits.BodyLimit refuses it by Content-Length before
a byte is read, or as the bytes pass the cap), the operator's role is checked before the body is read, the file
part is spooled to disk (never held in memory past 1 MiB) and copied into the store's staging, and the form's
CSRF token is checked before anything of it is kept."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from agent.controlplane import packages, repo
from agent.controlplane.limits import UPLOAD_PATH
from agent.controlplane.models import AuditEntry, ModelVersion, Rollout
from agent.controlplane.rollouts import rollout_dict
from agent.controlplane.schemas import NAME, Push
from agent.controlplane.sessions import same
from agent.controlplane.web import Visit, _flash, _page, _who, error_page
from agent.errors import ConfigError, EdgeAgentError
from agent.fleet.rollout_plan import rollout_id

router = APIRouter(include_in_schema=False)
FIELD_BYTES = 4096  # a form field other than the file (name, version, csrf)


def _versions(request: Request) -> list[dict[str, Any]]:
    with request.app.state.cp.factory() as s:
        rows = s.scalars(select(ModelVersion).order_by(ModelVersion.name, ModelVersion.id)).all()
        return [
            {
                "name": m.name,
                "version": m.version,
                "sha256": m.sha256,
                "size": m.size,
                "format": m.format,
                "created_at": m.created_at,
            }
            for m in rows
        ]


def _models_page(request: Request, v: Visit, status: int = 200, **ctx: Any) -> Response:
    max_bytes = request.app.state.cp.settings.max_body_bytes
    resp = _page(request, "models.html", v, versions=_versions(request), max_bytes=max_bytes, **ctx)
    resp.status_code = status
    return resp


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request):
    v = _who(request)
    if isinstance(v, Response):
        return v
    return _models_page(request, v)


def _spool(src: IO[bytes], work: Path) -> Path:
    path = work / "upload"
    with open(path, "wb") as out:
        shutil.copyfileobj(src, out, 1024 * 1024)
    return path


@router.post(UPLOAD_PATH)
async def upload(request: Request):
    v = _who(request, "operator")  # before a byte of the body is read
    if isinstance(v, Response):
        return v
    ctx = request.app.state.cp
    async with request.form(max_files=1, max_fields=8, max_part_size=FIELD_BYTES) as form:
        if v.session is not None and not same(v.session.csrf, str(form.get("csrf") or "")):
            return error_page(403, "csrf: the form's token is missing or wrong; reload the page and try again", v)
        name, version = str(form.get("name") or "").strip(), str(form.get("version") or "").strip()
        entered = {"name": name, "version": version}
        file = form.get("package")
        if not isinstance(file, UploadFile) or not file.filename:
            return _models_page(request, v, 422, refused="package: choose a file (.onnx or .tar.gz)", entered=entered)
        ctx.settings.uploads_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=ctx.settings.uploads_dir) as tmp:
            path = await run_in_threadpool(_spool, file.file, Path(tmp))
            got = await run_in_threadpool(
                packages.receive, ctx, name, version, path, v.op.actor, form.get("store_anyway") == "yes"
            )
    if got.stored is None:
        shown = {**entered, "filename": file.filename}
        return _models_page(request, v, got.status, refused=got.refused, findings=got.findings, entered=shown)
    return RedirectResponse(f"/models/{name}/{version}", status_code=303)


@router.get("/models/{name}/{version}", response_class=HTMLResponse)
def version_page(request: Request, name: str, version: str):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        row = s.scalar(select(ModelVersion).where(ModelVersion.name == name, ModelVersion.version == version))
        if row is None:
            return error_page(404, f"no model version {name} {version}", v)
        upload = s.scalar(
            select(AuditEntry)
            .where(AuditEntry.action == "model.upload", AuditEntry.target == f"{name}/{version}")
            .order_by(AuditEntry.id.desc())
        )
        uploaded = {"actor": upload.actor, "ts": upload.ts, "detail": upload.detail or {}} if upload else None
        existing = s.get(Rollout, rollout_id(name, version))
        rollout = rollout_dict(existing, brief=True) if existing is not None else None
        groups, targets = repo.groups(s), repo.targets(s)
        mv = {
            "name": row.name,
            "version": row.version,
            "sha256": row.sha256,
            "size": row.size,
            "format": row.format,
            "created_at": row.created_at,
        }
    notice = v.session.pop_flash() if v.session else None
    ctx = dict(mv=mv, uploaded=uploaded, rollout=rollout, groups=groups, targets=targets, notice=notice)
    return _page(request, "model.html", v, models=[(name, version)], **ctx)


def _push_targets(request: Request, devices: str, group: str, target: str) -> tuple[list[str], list[str], str]:
    """(device ids, groups, in words) of a push form: exactly one of devices (ids separated by commas or spaces),
    a group, or a hardware class (its accepted devices, as the registry has them now)."""
    given = [bool(devices.strip()), bool(group), bool(target)]
    if sum(given) != 1:
        raise ConfigError("targets: give device ids, a group or a hardware class (one of the three)")
    if group:
        if not re.match(NAME, group):
            raise ConfigError(f"group: {group[:80]!r} is not a group name")
        return [], [group], f"group {group}"
    if target:
        with request.app.state.cp.factory() as s:
            _, rows = repo.list_devices(s, state="accepted", target=target, limit=None)
        ids = [r.device_id for r in rows]
        if not ids:
            raise ConfigError(f"target: no accepted device of hardware class {target[:64]!r}")
        return ids, [], f"hardware class {target} ({len(ids)} devices)"
    ids = sorted({d for d in devices.replace(",", " ").split() if d})
    bad = [d for d in ids if not re.match(NAME, d)]
    if bad:
        raise ConfigError(f"devices: {bad[0][:80]!r} is not a device id")
    return ids, [], f"{len(ids)} device(s)"


@router.post("/models/{name}/{version}/push")
def push_page(
    request: Request,
    name: str,
    version: str,
    devices: str = Form(""),
    group: str = Form(""),
    target: str = Form(""),
    csrf: str = Form(""),
):
    v = _who(request, "operator", csrf)
    if isinstance(v, Response):
        return v
    from pydantic import ValidationError

    from agent.controlplane.pushes import push_version

    try:
        packages.check_names(name, version)
        ids, groups, words = _push_targets(request, devices, group.strip(), target.strip())
        doc = push_version(
            request.app.state.cp, Push(model=name, version=version, devices=ids, groups=groups), v.op.actor
        )
        _flash(
            v, f"pushed {name} {version} to {words}: {', '.join(doc['targets']['devices'] or doc['targets']['groups'])}"
        )
    except (ValidationError, EdgeAgentError) as exc:
        _flash(v, f"not pushed: {exc}")
    return RedirectResponse(f"/models/{quote(name)}/{quote(version)}", status_code=303)
