"""The dashboard's audit page: every entry of the audit log (who did what to what, with its detail), newest
first, paged, filtered by actor and action from their start; admins only, as GET /api/v1/audit is."""

from __future__ import annotations

import json

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from agent.controlplane import repo
from agent.controlplane.web import MAX_PAGE, PAGE, _page, _who

router = APIRouter(include_in_schema=False)
DETAIL_CHARS = 600  # a longer detail is cut (the API has it whole)


def _detail(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if value else ""
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + " ... (cut; GET /api/v1/audit has it whole)"


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    actor: str = Query("", max_length=80),
    action: str = Query("", max_length=64),
    page: int = Query(0, ge=0, le=MAX_PAGE),
):
    v = _who(request, "admin")
    if isinstance(v, Response):
        return v
    with request.app.state.cp.factory() as s:
        total, entries = repo.audit_entries(s, actor, action, page * PAGE, PAGE)
    for e in entries:
        e["detail_text"] = _detail(e["detail"])
    filters = {"actor": actor, "action": action}
    return _page(request, "audit.html", v, entries=entries, total=total, page=page, size=PAGE, filters=filters)
