"""The dashboard's device list: filtered and grouped by state, group, hardware class, provider, model version,
precision and health (query parameters, so a link or a refresh keeps them; agent.controlplane.devicefilter),
paged, with each device's health and, per model, why its provider was chosen."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from agent.controlplane import repo
from agent.controlplane.devicefilter import GROUP_BY, HEALTH, DeviceQuery, listing
from agent.controlplane.web import MAX_PAGE, PAGE, _page, _who

router = APIRouter(include_in_schema=False)


@router.get("/devices", response_class=HTMLResponse)
def devices(request: Request, q: Annotated[DeviceQuery, Query()], page: int = Query(0, ge=0, le=MAX_PAGE)):
    v = _who(request)
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        found = listing(s, q, page * PAGE, PAGE)
        known = repo.groups(s)
    ctx = dict(q=q, found=found, page=page, size=PAGE, health_values=HEALTH, group_by=GROUP_BY, known_groups=known)
    return _page(request, "devices.html", v, **ctx)
