"""The JSON API of what the service observes: a device's or a hardware class's telemetry, the fleet evidence
matrix and the alerts (viewer role; docs/control-plane.md, "Telemetry, charts and alerts")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from agent.controlplane import alerts, matrix, repo, telemetry_query
from agent.controlplane.auth import Operator, need

router = APIRouter(prefix="/api/v1", tags=["observe"])
AsViewer = Annotated[Operator, Depends(need("viewer"))]


def _bounds(request: Request) -> dict[str, Any]:
    t = request.app.state.cp.settings.telemetry
    return {"bucket_s": t.bucket_s, "max_points": t.max_points, "retention_s": t.retention_s}


@router.get("/devices/{device_id}/telemetry")
def device_telemetry(request: Request, device_id: str, op: AsViewer) -> dict[str, Any]:
    cp = request.app.state.cp
    with cp.factory() as s:
        repo.device(s, device_id)  # 404 for an unknown device
        data = telemetry_query.series(s, cp.settings.telemetry.max_points, device_id=device_id)
    return {"device_id": device_id, **_bounds(request), **data}


@router.get("/telemetry")
def class_telemetry(request: Request, op: AsViewer, target: str = Query("", max_length=64)) -> dict[str, Any]:
    """A hardware class's telemetry (target "" : the devices of no known class)."""
    cp = request.app.state.cp
    with cp.factory() as s:
        data = telemetry_query.series(s, cp.settings.telemetry.max_points, target=target or None)
    return {"target": target or None, **_bounds(request), **data}


@router.get("/evidence")
def evidence(request: Request, op: AsViewer) -> dict[str, Any]:
    with request.app.state.cp.factory() as s:
        return matrix.matrix(s)


@router.get("/alerts")
def alert_list(
    request: Request, op: AsViewer, state: str = Query("active", pattern="^(active|cleared)$")
) -> dict[str, Any]:
    with request.app.state.cp.factory() as s:
        rows = [alerts.alert_dict(a) for a in alerts.listing(s, active=state == "active")]
    return {"state": state, "alerts": rows, "webhook": request.app.state.cp.settings.alerts.webhook.url is not None}
