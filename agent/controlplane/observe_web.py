"""The dashboard's pages of what the service observes: health and model charts per device and per hardware class
(server-side SVG), the fleet evidence matrix and each of its cells, and the alerts. Read-only pages (no form),
signed in like every page (agent.controlplane.web)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import func, select

from agent.controlplane import alerts, matrix, repo, telemetry_query
from agent.controlplane.models import ACCEPTED, Device
from agent.controlplane.web import MAX_PAGE, PAGE, _page, _who, error_page
from agent.errors import EdgeAgentError

router = APIRouter(include_in_schema=False)


@router.get("/devices/{device_id}/charts", response_class=HTMLResponse)
def device_charts(request: Request, device_id: str):
    v = _who(request)
    if isinstance(v, Response):
        return v
    cp = request.app.state.cp
    with cp.factory() as s:
        try:
            dev = repo.device_dict(repo.device(s, device_id))
        except EdgeAgentError as exc:
            return error_page(404, str(exc), v)
        data = telemetry_query.series(s, cp.settings.telemetry.max_points, device_id=device_id)
    charts = telemetry_query.charts(data, per_device=True)
    return _page(request, "charts.html", v, dev=dev, target=None, charts=charts, t=cp.settings.telemetry)


@router.get("/charts", response_class=HTMLResponse)
def class_charts(request: Request, target: str | None = Query(None, max_length=64)):
    """Without `target`: the hardware classes; with it (empty: no known class): that class's charts."""
    v = _who(request)
    if isinstance(v, Response):
        return v
    cp = request.app.state.cp
    with cp.factory() as s:
        if target is None:
            rows = s.execute(
                select(Device.target, func.count())
                .where(Device.state == ACCEPTED)
                .group_by(Device.target)
                .order_by(Device.target)
                .limit(1000)
            ).all()
            return _page(request, "classes.html", v, classes=[(t or "", int(n)) for t, n in rows])
        data = telemetry_query.series(s, cp.settings.telemetry.max_points, target=target or None)
    charts = telemetry_query.charts(data, per_device=False)
    return _page(request, "charts.html", v, dev=None, target=target, charts=charts, t=cp.settings.telemetry)


@router.get("/evidence", response_class=HTMLResponse)
def evidence(request: Request):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        m = matrix.matrix(s)
    return _page(request, "matrix.html", v, m=m)


@router.get("/evidence/cell", response_class=HTMLResponse)
def evidence_cell(
    request: Request,
    model: str = Query(..., max_length=64),
    version: str = Query(..., max_length=64),
    target: str = Query("", max_length=64),
    page: int = Query(0, ge=0, le=MAX_PAGE),
):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        rows = matrix.cell_devices(s, model, version, target or None, page * PAGE, PAGE + 1)
    more, rows = len(rows) > PAGE, rows[:PAGE]
    ctx = {"model": model, "version": version, "target": target, "page": page, "more": more}
    return _page(request, "matrix_cell.html", v, rows=rows, **ctx)


@router.get("/alerts", response_class=HTMLResponse)
def alert_page(request: Request):
    v = _who(request)
    if isinstance(v, Response):
        return v
    cp = request.app.state.cp
    with cp.factory() as s:
        active = [alerts.alert_dict(a) for a in alerts.listing(s, active=True)]
        cleared = [alerts.alert_dict(a) for a in alerts.listing(s, active=False, limit=50)]
    hook = cp.settings.alerts.webhook.url is not None
    return _page(request, "alerts.html", v, active=active, cleared=cleared, hook=hook, cfg=cp.settings.alerts)
