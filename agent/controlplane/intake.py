"""The intake of what devices post without an operator token (enrollment requests, signed documents), in the
order that keeps a flood cheap: the rate limit of the source address (and of the device, for its documents)
before a byte of the body is read, the body under its route's cap (limits.BodyLimit), JSON depth and element
counts on the bytes before parsing, the document's schema (docschema), then the rate limit of the key it presents.
Domain errors become HTTP here (429 with Retry-After, 413, 400, 422)."""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi import HTTPException, Request

from agent.controlplane import docschema, limits
from agent.controlplane.ratelimit import RateLimited


async def read_document(request: Request, kind: str) -> dict[str, Any]:
    """The posted document of `kind` (enroll, decision, conformance), checked; HTTPException otherwise."""
    cp = request.app.state.cp
    lim = cp.settings.limits
    try:
        address = request.client.host if request.client else None
        if "device_id" in request.path_params:  # the address's bucket, then the device's, in one take
            cp.guard.device_post(address, request.path_params["device_id"])
        else:
            cp.guard.address(address)
        doc = limits.loads(await request.body(), lim)
        docschema.check(kind, doc, lim.hardware_bytes)
        if kind == "enroll" and isinstance(doc.get("public_key"), str):
            kid = hashlib.sha256(doc["public_key"].strip().encode()).hexdigest()[:32]
            cp.guard.key(f"pem:{kid}", "this enrollment key")
    except RateLimited as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": str(max(1, round(exc.retry_after)))}) from None
    except limits.TooComplex as exc:
        raise HTTPException(413, str(exc)) from None
    return doc
