"""The dashboard: server-rendered HTML (Jinja2), no build step, nothing from a CDN, readable without JavaScript.
Forms post to the same actions as the API (same rules, same audit log); the operator token sits in an
HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from agent.controlplane import attestations, enroll, repo, tokens
from agent.controlplane.auth import COOKIE, Operator, authenticate
from agent.controlplane.db import write
from agent.controlplane.models import ModelVersion, Rollout
from agent.controlplane.rollouts import rollout_dict, start_rollout, transition
from agent.controlplane.schemas import NewRollout
from agent.errors import EdgeAgentError
from agent.fleet.outcome import ON_PROBATION, model_phase

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))


def _when(ts: float | None) -> str:
    """A unix time as UTC text (the dashboard's one time format)."""
    import datetime

    if not ts:
        return "never"
    return datetime.datetime.fromtimestamp(float(ts), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["when"] = _when
templates.env.filters["model_state"] = lambda m: (
    model_phase(m)[1] if model_phase(m)[0] == ON_PROBATION else m.get("state")
)
router = APIRouter(include_in_schema=False)
PAGE = 50


def static_files() -> StaticFiles:
    return StaticFiles(directory=str(HERE / "static"))


def _page(request: Request, name: str, op: Operator, **ctx: Any) -> HTMLResponse:
    loop = request.app.state.cp.loop_state()
    return templates.TemplateResponse(request, name, {"op": op, "fleet": loop, **ctx})


def _login_redirect(request: Request) -> RedirectResponse:
    return RedirectResponse("/login?" + urlencode({"next": request.url.path}), status_code=303)


def _who(request: Request, role: str = "viewer") -> Operator | Response:
    op = authenticate(request)
    if op is None:
        return _login_redirect(request)
    if not tokens.allows(op.role, role):
        return HTMLResponse(f"role {op.role} may not do this (needs {role})", status_code=403)
    return op


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/", error: str | None = None):
    return templates.TemplateResponse(request, "login.html", {"next": next, "error": error, "op": None, "fleet": {}})


@router.post("/login")
def login(request: Request, token: str = Form(...), next: str = Form("/")):
    with request.app.state.cp.factory() as s:
        ok = tokens.operator(s, token.strip()) is not None
    if not ok:
        return RedirectResponse("/login?" + urlencode({"next": next, "error": "unknown token"}), status_code=303)
    target = next if next.startswith("/") and not next.startswith("//") else "/"
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(COOKIE, token.strip(), httponly=True, samesite="strict")
    return resp


@router.post("/logout")
def logout():
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(COOKIE)
    return resp


@router.get("/", response_class=HTMLResponse)
def overview(request: Request):
    op = _who(request)
    if isinstance(op, Response):
        return op
    with request.app.state.cp.factory() as s:
        ov = repo.overview(s)
        rows = s.scalars(select(Rollout).order_by(Rollout.created_at.desc()).limit(10)).all()
        recent = [rollout_dict(r, brief=True) for r in rows]
    return _page(request, "overview.html", op, overview=ov, rollouts=recent)


@router.get("/devices", response_class=HTMLResponse)
def devices(
    request: Request, state: str = "accepted", group: str = "", target: str = "", provider: str = "", page: int = 0
):
    op = _who(request)
    if isinstance(op, Response):
        return op
    with request.app.state.cp.factory() as s:
        total, rows = repo.list_devices(
            s,
            state=state or None,
            group=group or None,
            target=target or None,
            provider=provider or None,
            offset=max(0, page) * PAGE,
            limit=PAGE,
        )
        items = [repo.device_dict(r) for r in rows]
    filters = {"state": state, "group": group, "target": target, "provider": provider}
    return _page(request, "devices.html", op, devices=items, total=total, page=page, size=PAGE, filters=filters)


@router.get("/pending", response_class=HTMLResponse)
def pending(request: Request):
    op = _who(request)
    if isinstance(op, Response):
        return op
    with request.app.state.cp.factory() as s:
        total, rows = repo.list_devices(s, state="pending", limit=500)
        items = [repo.device_dict(r) for r in rows]
    return _page(request, "pending.html", op, devices=items, total=total)


@router.get("/devices/{device_id}", response_class=HTMLResponse)
def device_page(request: Request, device_id: str):
    op = _who(request)
    if isinstance(op, Response):
        return op
    with request.app.state.cp.factory() as s:
        dev = repo.device_dict(repo.device(s, device_id), full=True)
        decisions = [d.doc for d in repo.documents(s, device_id, "decision", 10)]
        reports = [d.doc for d in repo.documents(s, device_id, "conformance", 3)]
        signed = attestations.listing(s, device_id, 10)
    return _page(request, "device.html", op, dev=dev, decisions=decisions, reports=reports, attestations=signed)


@router.post("/devices/{device_id}/{action}")
def device_action(request: Request, device_id: str, action: str, groups: str = Form("")):
    op = _who(request, "operator")
    if isinstance(op, Response):
        return op
    wanted = [g.strip() for g in groups.split(",") if g.strip()] or None
    try:
        with write(request.app.state.cp.factory) as s:
            if action in ("accept", "reject"):
                enroll.decide(s, device_id, action == "accept", op.actor, wanted if action == "accept" else None)
            else:
                return HTMLResponse(f"unknown action {action}", status_code=404)
    except EdgeAgentError as exc:
        return HTMLResponse(str(exc), status_code=400)
    request.app.state.cp.registry_changed()
    return RedirectResponse("/pending", status_code=303)


@router.get("/rollouts", response_class=HTMLResponse)
def rollouts(request: Request, error: str | None = None):
    op = _who(request)
    if isinstance(op, Response):
        return op
    with request.app.state.cp.factory() as s:
        rows = [rollout_dict(r, brief=True) for r in s.scalars(select(Rollout).order_by(Rollout.created_at.desc()))]
        models = [
            (m.name, m.version) for m in s.scalars(select(ModelVersion).order_by(ModelVersion.name, ModelVersion.id))
        ]
        groups = repo.groups(s)
    return _page(request, "rollouts.html", op, rollouts=rows, models=models, groups=groups, error=error)


@router.post("/rollouts")
def rollout_start(
    request: Request,
    model_version: str = Form(...),
    group: str = Form(""),
    cohort_by: str = Form(""),
    canary: str = Form("1"),
    wave_size: str = Form("25%"),
    max_failures: str = Form("0%"),
    deadline_s: float = Form(600.0),
    rate_per_minute: str = Form(""),
    min_devices: int = Form(0),
):
    op = _who(request, "operator")
    if isinstance(op, Response):
        return op
    from pydantic import ValidationError

    model, _, version = model_version.partition(" ")
    try:
        body = NewRollout.model_validate(
            dict(
                model=model,
                version=version,
                group=group or None,
                cohort_by=cohort_by or None,
                canary=canary,
                wave_size=wave_size,
                max_failures=max_failures,
                deadline_s=deadline_s,
                rate_per_minute=float(rate_per_minute) if rate_per_minute else None,
                min_devices=min_devices,
            )
        )
        out = start_rollout(request.app.state.cp, body, op.actor)
    except (ValidationError, ValueError, EdgeAgentError) as exc:
        return RedirectResponse("/rollouts?" + urlencode({"error": str(exc)[:300]}), status_code=303)
    return RedirectResponse(f"/rollouts/{out['rollout_id']}", status_code=303)


@router.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
def rollout_page(request: Request, rollout_id: str, error: str | None = None):
    op = _who(request)
    if isinstance(op, Response):
        return op
    with request.app.state.cp.factory() as s:
        row = s.get(Rollout, rollout_id)
        if row is None:
            return HTMLResponse(f"no rollout {rollout_id}", status_code=404)
        r = rollout_dict(row)
    return _page(request, "rollout.html", op, r=r, error=error)


@router.post("/rollouts/{rollout_id}/{action}")
def rollout_action(request: Request, rollout_id: str, action: str):
    op = _who(request, "operator")
    if isinstance(op, Response):
        return op
    if action not in ("halt", "resume", "rollback"):
        return HTMLResponse(f"unknown action {action}", status_code=404)
    try:
        transition(request.app.state.cp, rollout_id, action, op.actor)
    except EdgeAgentError as exc:
        return RedirectResponse(f"/rollouts/{rollout_id}?" + urlencode({"error": str(exc)}), status_code=303)
    return RedirectResponse(f"/rollouts/{rollout_id}", status_code=303)
