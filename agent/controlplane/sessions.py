"""Dashboard sign-in sessions: a random session id in an HttpOnly, SameSite=Strict cookie (Secure, and named
`__Host-...`, when served over TLS), mapped in memory to the SHA-256 of the operator token that signed in and to
the session's CSRF token. The cookie never carries the operator token, and the JSON API ignores it (bearer
tokens only). Sessions live in the service's memory: a restart signs everyone out."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

SESSION_COOKIE = "eacp_session"
LOGIN_COOKIE = "eacp_login"  # the sign-in form's own CSRF nonce (double submit: cookie and hidden field)
LIFETIME_S = 12 * 3600.0
MAX_SESSIONS = 1000  # only a valid operator token makes one; the oldest goes first past this


@dataclass
class Session:
    sid: str
    token_hash: str
    csrf: str
    created: float
    flash: str | None = field(default=None)

    def pop_flash(self) -> str | None:
        msg, self.flash = self.flash, None
        return msg


class Sessions:
    def __init__(self, lifetime_s: float = LIFETIME_S, cap: int = MAX_SESSIONS):
        self.lifetime_s = lifetime_s
        self.cap = cap
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def create(self, token_hash: str) -> Session:
        s = Session(secrets.token_urlsafe(32), token_hash, secrets.token_urlsafe(32), time.time())
        with self._lock:
            self._by_id[s.sid] = s
            while len(self._by_id) > self.cap:
                self._by_id.popitem(last=False)
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            s = self._by_id.get(sid)
            if s is not None and time.time() - s.created > self.lifetime_s:
                del self._by_id[sid]
                return None
            return s

    def drop(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


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
