"""The alert webhook: POST one JSON document per raised alert to `alerts.webhook.url`, from its own thread with a
bounded queue (an offer never waits: a full queue leaves the alert pending in the database, offered again on the
next check), a timeout on every socket operation and a deadline on reading the answer, at most `response_bytes`
of it read (the answer is hostile: only its status counts, 2xx), no redirects followed, retries with a doubling
back-off up to `max_attempts`. A slow or dead receiver delays only this thread, never the service."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from agent.controlplane.observe_settings import WebhookSettings

log = logging.getLogger("edge_agent.controlplane")
Result = Callable[[str, bool, int, str | None], None]  # key, delivered, attempts, error


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0913 - urllib's signature
        return None  # a 3xx is an answer like any other: not delivered


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, doc: dict[str, Any], timeout_s: float, read_limit: int) -> tuple[bool, str]:
    """(delivered, note): delivered when the answer's status is 2xx; the note names what went wrong."""
    body = json.dumps(doc, sort_keys=True).encode()
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "edge-agent-control-plane"},
    )
    deadline = time.monotonic() + timeout_s
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            status = resp.status
            got = 0
            while got < read_limit and time.monotonic() < deadline:
                chunk = resp.read1(min(1024, read_limit - got))
                if not chunk:
                    break
                got += len(chunk)
    except urllib.error.HTTPError as exc:
        exc.close()
        return False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, timed out, reset, a malformed answer
        return False, f"{type(exc).__name__}: {exc}"[:300]
    if 200 <= status < 300:
        return True, f"HTTP {status}"
    return False, f"HTTP {status}"


class WebhookSender:
    def __init__(self, cfg: WebhookSettings, on_result: Result):
        self.cfg, self.on_result = cfg, on_result
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=cfg.queue)
        self._inflight: set[str] = set()
        self._done: dict[tuple[str, Any], None] = {}  # (key, raised_at) finished: a stale re-offer is ignored
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    def start(self) -> "WebhookSender":
        self._thread = threading.Thread(target=self._run, name="cp-webhook", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.timeout_s * 2 + 5)

    def offer(self, doc: dict[str, Any]) -> bool:
        """Queue one alert (its `key` once at a time); False when the queue is full (it stays pending)."""
        with self._lock:
            if doc["key"] in self._inflight or (doc["key"], doc.get("raised_at")) in self._done:
                return True
            try:
                self._queue.put_nowait(doc)
            except queue.Full:
                return False
            self._inflight.add(doc["key"])
            return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                doc = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._deliver(doc)
            finally:
                with self._lock:
                    self._inflight.discard(doc["key"])
                    self._done[(doc["key"], doc.get("raised_at"))] = None
                    while len(self._done) > 10_000:
                        del self._done[next(iter(self._done))]

    def _deliver(self, doc: dict[str, Any]) -> None:
        cfg, note = self.cfg, ""
        assert cfg.url is not None
        for attempt in range(1, cfg.max_attempts + 1):
            ok, note = post(cfg.url, doc, cfg.timeout_s, cfg.response_bytes)
            if ok:
                self.delivered += 1
                self._report(doc["key"], True, attempt, None)
                return
            log.warning("alert webhook: %s (attempt %d of %d)", note, attempt, cfg.max_attempts)
            if attempt < cfg.max_attempts and self._stop.wait(min(60.0, cfg.backoff_s * 2 ** (attempt - 1))):
                return  # stopping: the alert stays pending and is offered again after a restart
        self._report(doc["key"], False, cfg.max_attempts, note)

    def _report(self, key: str, ok: bool, attempts: int, error: str | None) -> None:
        try:
            self.on_result(key, ok, attempts, error)
        except Exception:  # noqa: BLE001 - a database fault must not end the sender
            log.exception("alert webhook: recording the delivery of %s failed", key)
