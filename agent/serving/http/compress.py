"""HTTP response compression (Accept-Encoding: gzip, deflate), the copy counted against the request budget."""

from __future__ import annotations

import zlib

from agent.errors import ServingError
from agent.serving.budget import Ledger
from agent.serving.http.handlers import Response

COMPRESS_MIN = 1024  # responses smaller than this go out uncompressed


def _pick_encoding(accept: str) -> str | None:
    """gzip or deflate from an Accept-Encoding header (q=0 excludes), gzip first; None for neither."""
    offered: dict[str, float] = {}
    for item in accept.lower().split(","):
        name, _, rest = item.strip().partition(";")
        q = 1.0
        if rest.strip().startswith("q="):
            try:
                q = float(rest.strip()[2:])
            except ValueError:
                q = 0.0
        offered[name.strip()] = q
    for enc in ("gzip", "deflate"):
        if offered.get(enc, offered.get("*", 0.0)) > 0:
            return enc
    return None


def compress(resp: Response, accept: str, ledger: Ledger) -> Response:
    """The response gzip- or deflate-encoded when the client accepts it and it is worth it (Content-Encoding;
    Inference-Header-Content-Length keeps counting the uncompressed JSON header, as Triton does). The copy it
    needs is counted against the request budget first; when it does not fit, the response goes out as it is."""
    parts, length = resp.buffers()
    enc = _pick_encoding(accept)
    if enc is None or length < COMPRESS_MIN:
        return resp
    try:
        ledger.charge(2 * length, "compressing the response")
    except ServingError:
        return resp
    c = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16 if enc == "gzip" else zlib.MAX_WBITS)
    out = [c.compress(memoryview(p).cast("B")) for p in parts if memoryview(p).nbytes]
    out.append(c.flush())
    body = b"".join(out)
    return Response(
        resp.status, body, resp.content_type, {**resp.headers, "Content-Encoding": enc, "Vary": "Accept-Encoding"}
    )
