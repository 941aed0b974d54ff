"""The dashboard's device list: filtered and grouped by state, group, hardware class, provider, model version,
precision and health (query parameters, so a link or a refresh keeps them; agent.controlplane.devicefilter),
paged, with each device's health and, per model, why its provider was chosen."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from agent.controlplane import repo
from agent.controlplane.devicefilter import GROUP_BY, HEALTH, DeviceQuery, listing
from agent.controlplane.web import MAX_PAGE, PAGE, _page, _who, error_page

router = APIRouter(include_in_schema=False)


@router.get("/devices", response_class=HTMLResponse)
def devices(
    request: Request,
    q: Annotated[DeviceQuery, Query()],
    page: int = Query(0, ge=0, le=MAX_PAGE),
    after: str = Query("", max_length=120),
):
    """`after` (the "next" link's cursor): the page behind that device, by id, stable while devices enroll;
    `page` (numbered pages) stays, and a list filtered or grouped by status is paged by number only."""
    v = _who(request)
    if isinstance(v, Response):
        return v
    try:
        start = repo.after_id(after) if after and not q.by_status else None
    except repo.BadCursor as exc:
        return error_page(400, str(exc), v)
    with request.app.state.cp.factory() as s:
        found = listing(s, q, 0 if start else page * PAGE, PAGE, after=start)
        known = repo.groups(s)
    ctx = dict(q=q, found=found, page=page, size=PAGE, health_values=HEALTH, group_by=GROUP_BY, known_groups=known,
               after=after if start else "")  # fmt: skip
    return _page(request, "devices.html", v, **ctx)
