"""Limits before parsing: the request-body cap of each route (refused by Content-Length first, and counted while
the body streams in, with or without one), JSON nesting depth and element counts checked on the bytes before
json.loads (which cannot be stopped once it recurses), and the `limits` section of the service's config."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

from starlette.exceptions import HTTPException

from agent.errors import ConfigError, EdgeAgentError


@dataclass(frozen=True)
class Limits:
    """Every limit of the service with its default (docs/control-plane.md, "Limits and rate limits")."""

    enroll_body_bytes: int = 32 * 1024  # POST /api/v1/enroll
    document_body_bytes: int = 1024 * 1024  # POST /api/v1/devices/{id}/decisions|conformance
    api_body_bytes: int = 1024 * 1024  # every other request body but a model upload (max_body_bytes)
    json_depth: int = 32
    json_items: int = 50_000  # values (scalars, arrays, objects) in one JSON body
    hardware_bytes: int = 16 * 1024  # an enrollment's or status's `hardware`, as compact JSON
    pending_max: int = 1000  # pending devices kept; the oldest is dropped for a new one
    address_per_minute: float = 120.0  # enrollment and device posts per source address
    address_burst: int = 120
    key_per_minute: float = 30.0  # per enrollment key (enroll) and per device (its document posts)
    key_burst: int = 30


_MINIMUM = {"enroll_body_bytes": 1024, "document_body_bytes": 1024, "api_body_bytes": 1024, "hardware_bytes": 256}


def parse_limits(doc: Any) -> Limits:
    """The `limits` mapping of the config (every key optional; errors name the key)."""
    if doc is None:
        return Limits()
    if not isinstance(doc, dict):
        raise ConfigError("limits: expected a mapping")
    known = {f.name: f for f in fields(Limits)}
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise ConfigError(f"limits.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for name, value in doc.items():
        rate = name.endswith("_per_minute")
        ok = isinstance(value, (int, float) if rate else int) and not isinstance(value, bool)
        low = 0 if rate else _MINIMUM.get(name, 1)
        if not ok or value < low or (rate and value == 0) or value > 2**40:
            kind = "a number above 0" if rate else f"an integer of at least {low}"
            raise ConfigError(f"limits.{name}: expected {kind}, got {value!r}")
        values[name] = float(value) if rate else value
    return Limits(**values)


UPLOAD_PATH = "/models/upload"  # the dashboard's package upload (agent.controlplane.webmodels)


class TooLarge(HTTPException):
    """A request body over its route's cap: 413 (an HTTP error itself, raised while the body streams in, so
    that whatever reads the body, a route or FastAPI's own parsing, answers it)."""

    def __init__(self, cap: int):
        super().__init__(413, f"body: more than {cap} bytes for this route")


class TooComplex(EdgeAgentError):
    """A JSON body nested deeper or holding more values than allowed (HTTP 413 at the edge)."""


def body_cap(limits: Limits, max_body_bytes: int, method: str, path: str) -> int:
    """The cap for one request: model and release uploads large (the API's and the dashboard's), enrollment small, device
    documents in between."""
    if (method == "PUT" and path.startswith(("/api/v1/models/", "/api/v1/releases/"))) or (
        method == "POST" and path == UPLOAD_PATH
    ):
        return max_body_bytes
    if path == "/api/v1/enroll":
        return limits.enroll_body_bytes
    if path.startswith("/api/v1/devices/") and path.endswith(("/decisions", "/conformance")):
        return limits.document_body_bytes
    return limits.api_body_bytes


class BodyLimit:
    """ASGI middleware: a body over the route's cap gets 413 before the route reads it (Content-Length), or as
    soon as the streamed bytes pass the cap (chunked, or a Content-Length that lies); nothing past it is read."""

    def __init__(self, app, cap_for):
        self.app, self.cap_for = app, cap_for

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.cap_for(scope["method"], scope["path"])
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            await _refuse(send, cap, scope["path"])
            return
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    raise TooLarge(cap)
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except TooLarge:
            if not started:
                await _refuse(send, cap, scope["path"])


async def _refuse(send, cap: int, path: str = "/api/") -> None:
    """413, as JSON on the API and as the error page on the dashboard (whose upload form a browser posts)."""
    message = f"body: more than {cap} bytes for this route"
    if path.startswith("/api/"):
        body, ctype = json.dumps({"error": message}).encode(), b"application/json"
    else:
        from agent.controlplane.pages import render_error

        hint = f"{message} (the service's max_body_bytes); nothing was stored"
        body, ctype = render_error(413, hint).encode(), b"text/html; charset=utf-8"
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


# a string (possessive, its closing quote optional: an unterminated one ends the scan, never backtracks) or a
# structural character; linear in the body's size whatever the bytes
_TOKENS = re.compile(rb'"(?:[^"\\]++|\\.)*+"?|[\[\]{},]')


def check_json(raw: bytes, max_depth: int, max_items: int) -> None:
    """Refuse (TooComplex) JSON nested deeper than max_depth or holding more than max_items values, scanning the
    bytes (strings skipped) before anything is parsed; malformed JSON is left for json.loads to name."""
    depth = items = 0
    for m in _TOKENS.finditer(raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            items += 1
            if depth > max_depth:
                raise TooComplex(f"body: JSON nested deeper than {max_depth} levels")
        elif tok in (b"]", b"}"):
            depth -= 1
        elif tok == b",":
            items += 1
        if items > max_items:
            raise TooComplex(f"body: JSON with more than {max_items} values")


def loads(raw: bytes, limits: Limits) -> dict[str, Any]:
    """A JSON object from a request body within the depth and element limits; ConfigError (400) otherwise."""
    check_json(raw, limits.json_depth, limits.json_items)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"body: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError("body: expected a JSON object")
    return doc


def depth(value: Any, stop: int) -> int:
    """Nesting depth of a parsed value, counted without recursion (stops counting past `stop`)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > stop:
                return deepest
            todo.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
