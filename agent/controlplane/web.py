"""The dashboard: server-rendered HTML (Jinja2, autoescaped), no build step, nothing from a CDN, no inline script
(static/refresh.js and upload.js only; every page works without them; more pages in webdevices, webmodels and
webaudit). Forms post to the same actions as the API (same rules, same audit log). Signing in opens a session
(agent.controlplane.sessions: a random id in an HttpOnly, SameSite=Strict cookie); every form carries the
session's CSRF token, checked here in constant time, and agent.controlplane.security refuses unsafe requests
from another origin before they reach a route. Every HTML answer, errors included, comes from a template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy import select
from sqlalchemy.orm import defer

from agent.controlplane import attestations, enroll, repo, tokens
from agent.controlplane.auth import Operator, bearer
from agent.controlplane.db import write
from agent.controlplane.models import ModelVersion, OperatorToken, Rollout
from agent.controlplane.pages import HERE, render_error, templates
from agent.controlplane.rollouts import ACTIONS, rollout_dict, start_rollout, transition
from agent.controlplane.schemas import NewRollout
from agent.controlplane.security import safe_next
from agent.controlplane.sessions import LOGIN_COOKIE, SESSION_COOKIE, Session, clear_cookie, read_cookie, same
from agent.controlplane.sessions import set_cookie as put_cookie
from agent.errors import EdgeAgentError
from agent.fleet.agent_release import kind_of

router = APIRouter(include_in_schema=False)
PAGE = 50
LOGIN_ERRORS = {"token": "unknown token", "form": "the sign-in form had expired: sign in again"}


@dataclass(frozen=True)
class Visit:
    """Who is asking: the operator, and the session when signed in with the cookie (None with a bearer token)."""

    op: Operator
    session: Session | None

    @property
    def csrf(self) -> str:
        return self.session.csrf if self.session else ""


MAX_PAGE = 10**7  # a page number beyond is a 422


def static_files() -> StaticFiles:
    return StaticFiles(directory=str(HERE / "static"))


def _page(request: Request, name: str, v: Visit, **ctx: Any) -> HTMLResponse:
    loop = request.app.state.cp.loop_state()
    return templates.TemplateResponse(request, name, {"op": v.op, "csrf": v.csrf, "fleet": loop, **ctx})


def error_page(status: int, message: str, v: Visit | None = None) -> HTMLResponse:
    return HTMLResponse(render_error(status, message, v.op if v else None, v.csrf if v else ""), status_code=status)


def _login_redirect(request: Request) -> RedirectResponse:
    return RedirectResponse("/login?" + urlencode({"next": request.url.path}), status_code=303)


def _visit(request: Request) -> Visit | None:
    """A bearer token (not ambient: no CSRF token needed) or the session cookie."""
    sessions = request.app.state.sessions
    token = bearer(request)
    session = None if token else sessions.get(read_cookie(request, SESSION_COOKIE))
    if token is None and session is None:
        return None
    with request.app.state.cp.factory() as s:
        row = tokens.operator(s, token) if token else s.get(OperatorToken, session.token_hash if session else "")
        if row is None:
            return None
        return Visit(Operator(row.name, row.role), session)


def _who(request: Request, role: str = "viewer", csrf: str | None = None) -> Visit | Response:
    """The visitor, at least `role`; for a form post (`csrf` given) signed in by cookie, the session's CSRF
    token must match what the form carried."""
    v = _visit(request)
    if v is None:
        return _login_redirect(request)
    if csrf is not None and v.session is not None and not same(v.session.csrf, csrf):
        return error_page(403, "csrf: the form's token is missing or wrong; reload the page and try again", v)
    if not tokens.allows(v.op.role, role):
        return error_page(403, f"role {v.op.role} may not do this (needs {role})", v)
    return v


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/", error: str | None = None):
    import secrets

    nonce = secrets.token_urlsafe(32)
    ctx: dict[str, Any] = {
        "next": safe_next(next),
        "error": LOGIN_ERRORS.get(error or ""),
        "op": None,
        "fleet": {},
        "csrf": nonce,
    }
    resp = templates.TemplateResponse(request, "login.html", ctx)
    put_cookie(request, resp, LOGIN_COOKIE, nonce, max_age=3600)
    return resp


@router.post("/login")
def login(request: Request, token: str = Form(...), next: str = Form("/"), csrf: str = Form("")):
    target = safe_next(next)
    if not same(read_cookie(request, LOGIN_COOKIE), csrf):
        return RedirectResponse("/login?" + urlencode({"next": target, "error": "form"}), status_code=303)
    with request.app.state.cp.factory() as s:
        row = tokens.operator(s, token.strip())
        token_hash = row.token_hash if row is not None else None
    if token_hash is None:
        return RedirectResponse("/login?" + urlencode({"next": target, "error": "token"}), status_code=303)
    session = request.app.state.sessions.create(token_hash)
    resp = RedirectResponse(target, status_code=303)
    put_cookie(request, resp, SESSION_COOKIE, session.sid)
    clear_cookie(request, resp, LOGIN_COOKIE)
    return resp


@router.post("/logout")
def logout(request: Request, csrf: str = Form("")):
    v = _who(request, csrf=csrf)
    if isinstance(v, Response):
        return v
    if v.session is not None:
        request.app.state.sessions.drop(v.session.sid)
    resp = RedirectResponse("/login", status_code=303)
    clear_cookie(request, resp, SESSION_COOKIE)
    return resp


@router.get("/", response_class=HTMLResponse)
def overview(request: Request):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        ov = repo.overview(s)
        rows = s.scalars(
            select(Rollout).options(defer(Rollout.state)).order_by(Rollout.created_at.desc()).limit(10)
        ).all()
        recent = [rollout_dict(r, brief=True) for r in rows]
    return _page(request, "overview.html", v, overview=ov, rollouts=recent)


@router.get("/pending", response_class=HTMLResponse)
def pending(request: Request, page: int = Query(0, ge=0, le=MAX_PAGE)):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        total, rows = repo.list_devices(s, state="pending", offset=page * PAGE, limit=PAGE)
        items = [repo.device_dict(r) for r in rows]
    return _page(request, "pending.html", v, devices=items, total=total, page=page, size=PAGE)


@router.get("/devices/{device_id}", response_class=HTMLResponse)
def device_page(request: Request, device_id: str):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        dev = repo.device_dict(repo.device(s, device_id), full=True)
        decisions = [d.doc for d in repo.documents(s, device_id, "decision", 10)]
        reports = [d.doc for d in repo.documents(s, device_id, "conformance", 3)]
        signed = attestations.listing(s, device_id, 10)
    return _page(request, "device.html", v, dev=dev, decisions=decisions, reports=reports, attestations=signed)


def _flash(v: Visit, message: str) -> None:
    """A message for the next page of this session (never carried in the URL, so a link cannot plant one)."""
    if v.session is not None:
        v.session.set_flash(message[:300])


@router.post("/devices/{device_id}/{action}")
def device_action(request: Request, device_id: str, action: str, groups: str = Form(""), csrf: str = Form("")):
    v = _who(request, "operator", csrf)
    if isinstance(v, Response):
        return v
    if action not in ("accept", "reject"):
        return error_page(404, f"unknown action {action}", v)
    wanted = [g.strip() for g in groups.split(",") if g.strip()] or None
    try:
        with write(request.app.state.cp.factory) as s:
            enroll.decide(s, device_id, action == "accept", v.op.actor, wanted if action == "accept" else None)
    except EdgeAgentError as exc:
        return error_page(400, str(exc), v)
    request.app.state.cp.registry_changed(device_id)
    return RedirectResponse("/pending", status_code=303)


@router.get("/rollouts", response_class=HTMLResponse)
def rollouts(request: Request):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        listed = select(Rollout).options(defer(Rollout.state)).order_by(Rollout.created_at.desc())
        rows = [rollout_dict(r, brief=True) for r in s.scalars(listed)]
        models = [
            (m.name, m.version) for m in s.scalars(select(ModelVersion).order_by(ModelVersion.name, ModelVersion.id))
        ]
        groups = repo.groups(s)
    error = v.session.pop_flash() if v.session else None
    return _page(request, "rollouts.html", v, rollouts=rows, models=models, groups=groups, error=error)


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
    csrf: str = Form(""),
):
    v = _who(request, "operator", csrf)
    if isinstance(v, Response):
        return v
    from pydantic import ValidationError

    model, _, version = model_version.partition(" ")
    kind = kind_of(model)  # an agent release's version is listed with the models, as `edge-agent VERSION`
    try:
        body = NewRollout.model_validate(
            dict(
                kind=kind,
                model=model if kind == "model" else None,
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
        out = start_rollout(request.app.state.cp, body, v.op.actor)
    except (ValidationError, ValueError, EdgeAgentError) as exc:
        _flash(v, str(exc))
        return RedirectResponse("/rollouts", status_code=303)
    return RedirectResponse(f"/rollouts/{out['rollout_id']}", status_code=303)


@router.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
def rollout_page(request: Request, rollout_id: str):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        row = s.get(Rollout, rollout_id)
        if row is None:
            return error_page(404, f"no rollout {rollout_id}", v)
        r = rollout_dict(row)
        ids = [d["device_id"] for d in (r["progress"] or {}).get("devices", [])]
        timing = repo.paired_timing(s, ids, str(r["model"]))
    error = v.session.pop_flash() if v.session else None
    return _page(request, "rollout.html", v, r=r, error=error, timing=timing)


@router.post("/rollouts/{rollout_id}/{action}")
def rollout_action(request: Request, rollout_id: str, action: str, csrf: str = Form("")):
    v = _who(request, "operator", csrf)
    if isinstance(v, Response):
        return v
    if action not in ACTIONS:
        return error_page(404, f"unknown action {action}", v)
    try:
        transition(request.app.state.cp, rollout_id, action, v.op.actor)
    except EdgeAgentError as exc:
        _flash(v, str(exc))
    return RedirectResponse(f"/rollouts/{rollout_id}", status_code=303)
