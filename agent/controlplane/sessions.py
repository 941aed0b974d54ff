"""Dashboard sign-in sessions: a random session id in an HttpOnly, SameSite=Strict cookie (Secure, and named
`__Host-...`, when served over TLS), mapped in the database (`web_sessions`, by the SHA-256 of the id: the id
itself is never stored) to the SHA-256 of the operator token that signed in and to the session's CSRF token.
The cookie never carries the operator token, and the JSON API ignores it (bearer tokens only). Every replica
on one database knows every session: a sign-in on one works on the others, and a restart signs no one out."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, update
from starlette.requests import Request
from starlette.responses import Response

from agent.controlplane.db import write
from agent.controlplane.shared_models import WebSession

SESSION_COOKIE = "eacp_session"
LOGIN_COOKIE = "eacp_login"  # the sign-in form's own CSRF nonce (double submit: cookie and hidden field)
LIFETIME_S = 12 * 3600.0
MAX_SESSIONS = 1000  # only a valid operator token makes one; the oldest goes first past this


def _hash(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


@dataclass
class Session:
    sid: str
    token_hash: str
    csrf: str
    created: float
    flash: str | None = field(default=None)
    store: Any = field(default=None, repr=False)

    def set_flash(self, message: str) -> None:
        """A message for this session's next page (kept in the database: the next page may be another replica)."""
        self.flash = message
        if self.store is not None:
            self.store.put_flash(self.sid, message)

    def pop_flash(self) -> str | None:
        msg, self.flash = self.flash, None
        if msg is not None and self.store is not None:
            self.store.put_flash(self.sid, None)
        return msg


class Sessions:
    """The sessions table behind the dashboard (a session factory of agent.controlplane.db)."""

    def __init__(self, factory, lifetime_s: float = LIFETIME_S, cap: int = MAX_SESSIONS):
        self.factory, self.lifetime_s, self.cap = factory, lifetime_s, cap

    def create(self, token_hash: str) -> Session:
        s = Session(secrets.token_urlsafe(32), token_hash, secrets.token_urlsafe(32), time.time(), store=self)
        with write(self.factory) as db:
            db.execute(delete(WebSession).where(WebSession.created < s.created - self.lifetime_s))
            db.add(WebSession(sid_hash=_hash(s.sid), token_hash=token_hash, csrf=s.csrf, created=s.created))
            db.flush()
            extra = (db.scalar(select(func.count()).select_from(WebSession)) or 0) - self.cap
            if extra > 0:
                oldest = select(WebSession.sid_hash).order_by(WebSession.created).limit(extra)
                db.execute(delete(WebSession).where(WebSession.sid_hash.in_(oldest.scalar_subquery())))
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid or len(sid) > 100:
            return None
        with self.factory() as db:
            row = db.get(WebSession, _hash(sid))
            if row is None:
                return None
            if time.time() - row.created > self.lifetime_s:
                self.drop(sid)
                return None
            return Session(sid, row.token_hash, row.csrf, row.created, row.flash, store=self)

    def drop(self, sid: str | None) -> None:
        with write(self.factory) as db:
            db.execute(delete(WebSession).where(WebSession.sid_hash == _hash(sid or "")))

    def put_flash(self, sid: str, message: str | None) -> None:
        with write(self.factory) as db:
            db.execute(update(WebSession).where(WebSession.sid_hash == _hash(sid)).values(flash=message))


def same(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison of a CSRF token with what the form carried (both present, non-empty)."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def secure(request: Request) -> bool:
    """Served over TLS (uvicorn's own TLS, or a trusted proxy's X-Forwarded-Proto: https)."""
    return request.url.scheme == "https"


def cookie_name(request: Request, base: str) -> str:
    """`__Host-` prefixed over TLS: the browser then takes it only with Secure, Path=/ and no Domain, so a
    sibling subdomain cannot set or overwrite it."""
    return f"__Host-{base}" if secure(request) else base


def read_cookie(request: Request, base: str) -> str | None:
    return request.cookies.get(cookie_name(request, base))


def set_cookie(request: Request, resp: Response, base: str, value: str, max_age: int | None = None) -> None:
    resp.set_cookie(
        cookie_name(request, base),
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure(request),
    )


def clear_cookie(request: Request, resp: Response, base: str) -> None:
    resp.delete_cookie(cookie_name(request, base), path="/", httponly=True, samesite="strict", secure=secure(request))
