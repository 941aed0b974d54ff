"""Request authentication of the JSON API: `Authorization: Bearer TOKEN` only, checked against the hashed operator
tokens; 401 without a valid token, 403 when the token's role is below what the route needs. A dashboard session
cookie gives no authority here (a script or a form that rides on the browser's cookie gets 401); the dashboard's
sessions are agent.controlplane.sessions."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException, Request

from agent.controlplane import tokens


@dataclass(frozen=True)
class Operator:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"operator:{self.name}"


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization") or ""
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return None


def authenticate(request: Request) -> Operator | None:
    token = bearer(request)
    if not token:
        return None
    with request.app.state.cp.factory() as s:
        row = tokens.operator(s, token)
        return Operator(row.name, row.role) if row is not None else None


def need(role: str):
    """A FastAPI dependency: the operator behind the request, at least `role`."""

    def dependency(request: Request) -> Operator:
        op = authenticate(request)
        if op is None:
            raise HTTPException(401, "token: missing or unknown operator token", headers={"WWW-Authenticate": "Bearer"})
        if not tokens.allows(op.role, role):
            raise HTTPException(403, f"token: role {op.role} may not do this (needs {role})")
        return op

    return dependency
