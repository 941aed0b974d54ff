"""Browser protections on every answer of the service (an ASGI middleware, outside the routes):

- headers: a strict Content-Security-Policy (scripts and styles only from /static, never inline; no framing, forms
  post only here, no <base>), `X-Content-Type-Options: nosniff`, `Referrer-Policy: same-origin`, `X-Frame-Options:
  DENY`, `Cache-Control: no-store` on HTML, and `Strict-Transport-Security` when served over TLS;
- origin: every unsafe method (POST, PUT, PATCH, DELETE), dashboard and API alike, is refused (403) when the
  browser says it comes from elsewhere: an `Origin` other than the service's own (scheme, host and port: a page on
  another port of the same host is refused too), or, without `Origin`, a `Sec-Fetch-Site` other than
  `same-origin`/`none`. Requests that carry neither (devices, the CLI, curl) pass on to the routes, where the
  dashboard's forms still need their session's CSRF token and the API a bearer token.

`safe_next` is the one rule for where the sign-in page may send the browser back to."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from agent.controlplane.pages import render_error

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
HSTS = (b"strict-transport-security", b"max-age=31536000")
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
SAME_FETCH_SITES = {"same-origin", "none"}
DEFAULT_PORTS = {"http": "80", "https": "443"}
_NEXT = re.compile(r"/(?![/\\])[^\\\x00-\x1f\x7f]*")


def safe_next(value: str | None) -> str:
    """`value` when it is a path on this service (one leading `/`, not `//` or `/\\`, no scheme, no host, no
    backslash or control character anywhere: browsers drop tabs and newlines and read `\\` as `/`);
    otherwise `/`."""
    if not value or len(value) > 2048 or not _NEXT.fullmatch(value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


def _origin(scheme: str, host: str) -> str:
    host = host.strip().lower()
    name, sep, port = host.rpartition(":")
    if sep and "]" not in port and port == DEFAULT_PORTS.get(scheme):
        host = name  # "https://cp:443" is "https://cp"
    return f"{scheme}://{host}"


def own_origin(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str:
    host = headers.get(b"host", b"").decode("latin-1")
    return _origin(scope.get("scheme", "http"), host)


def cross_origin(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str | None:
    """Why the browser says this request comes from another origin, or None."""
    origin = headers.get(b"origin")
    if origin is not None:
        text = origin.decode("latin-1").strip()
        parts = urlsplit(text.lower())
        given = _origin(parts.scheme, parts.netloc) if parts.scheme and parts.netloc else text
        if given != own_origin(scope, headers):
            return f"Origin {text[:200]!r} is not this service ({own_origin(scope, headers)})"
        return None
    site = headers.get(b"sec-fetch-site")
    if site is not None and site.decode("latin-1").strip().lower() not in SAME_FETCH_SITES:
        return f"Sec-Fetch-Site {site.decode('latin-1')[:40]!r}: the request comes from another site or origin"
    return None


class BrowserGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tls = scope.get("scheme") == "https"

        started = False

        async def with_headers(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [h for h in HEADERS if h[0] not in names]
                if tls:
                    headers.append(HSTS)
                ctype = dict(headers).get(b"content-type", b"")
                if ctype.startswith(b"text/html") and b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        if scope["method"] not in SAFE_METHODS:
            headers = {k.lower(): v for k, v in scope.get("headers", [])}
            why = cross_origin(scope, headers)
            if why is not None:
                return await _answer(scope, 403, f"origin: refused, {why}")(scope, receive, with_headers)
        try:
            await self.app(scope, receive, with_headers)
        except Exception:
            if not started:  # the 500 with these headers too (then the server logs the exception as before)
                await _answer(scope, 500, "internal error (logged by the service)")(scope, receive, with_headers)
            raise


def _answer(scope, status: int, message: str):
    from starlette.responses import HTMLResponse, JSONResponse

    if scope.get("path", "").startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    return HTMLResponse(render_error(status, message), status_code=status)
