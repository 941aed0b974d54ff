"""HttpPuller: resumable http(s) download of one artifact (Range requests), verified chunk by chunk.

The same staging file and bitmap as the MQTT puller: a cut connection or a restart resumes at the first
missing chunk; every chunk is checked against the manifest; the whole file is checked before the move.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from agent.artifacts.deadline import POLL_S, DownloadWatch
from agent.artifacts.manifest import Manifest
from agent.artifacts.pull import check_space
from agent.artifacts.recipe import Layout
from agent.artifacts.staging import Pieces, Staging
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError, ArtifactRefused


class HttpPuller:
    def __init__(
        self,
        store: ContentStore,
        *,
        stall_timeout: float = 30.0,
        ca: str | None = None,
        reserve_bytes: int = 0,
        retry_delay: float = 0.5,
        progress: Callable[..., None] | None = None,
    ) -> None:
        self.store, self.stall_timeout, self.reserve_bytes = store, stall_timeout, reserve_bytes
        self.retry_delay, self.progress = retry_delay, progress
        self._ctx = ssl.create_default_context(cafile=ca) if ca else None
        self.stats: dict[str, int] = {}

    def pull(
        self,
        manifest: Manifest,
        url: str | None = None,
        watch: DownloadWatch | None = None,
        layout: Layout | None = None,
    ) -> Path:
        """`watch` (agent.artifacts.deadline): progress and overall deadlines and the caller's cancel, checked at
        least every POLL_S while bytes trickle in or nothing comes. layout: a recipe.Layout (a delta pull): one
        Range request per run of missing chunks."""
        a = layout or manifest.artifact
        if url is None:
            src = manifest.source("http")
            if src is None:
                raise ArtifactRefused(f"{manifest.name} {manifest.version} has no http source")
            if src.url is None:
                raise ArtifactRefused(f"{manifest.name} {manifest.version}: its http source has no url")
            url = src.url
        if self.store.has(a.sha256):
            return self.store.path(a.sha256)
        staging = Staging(self.store, a).open()
        try:
            check_space(
                self.store, a.size - staging.bytes_have(), self.reserve_bytes, f"{manifest.name} {manifest.version}"
            )
            self.stats = {"resumed_bytes": staging.bytes_have(), "requests": 0, "received_bytes": 0}
            self._loop(manifest, staging, url, a, watch)
            return staging.finish()
        finally:
            staging.close()

    def _loop(self, manifest: Manifest, staging: Staging, url: str, a: Pieces, watch: DownloadWatch | None) -> None:
        last_progress, last_error = time.monotonic(), ""
        self._partial = (-1, bytearray())  # a chunk begun on a connection that timed out: resumed mid-chunk
        while not staging.done:
            before = (staging.bytes_have(), len(self._partial[1]))
            if watch is not None:
                watch.check()
            try:
                self._fetch_from(manifest, staging, url, staging.missing()[0], a, watch)
            except (OSError, urllib.error.URLError, ConnectionError) as exc:
                last_error = str(getattr(exc, "reason", None) or exc)[:200]
            if (staging.bytes_have(), len(self._partial[1])) != before:  # whole chunks or part of one
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress >= self.stall_timeout:
                raise ArtifactError(
                    f"download of {manifest.name} {manifest.version} from {url} stalled at "
                    f"{staging.bytes_have()}/{manifest.artifact.size} bytes: {last_error or 'no data'}"
                )
            if not staging.done and (staging.bytes_have(), len(self._partial[1])) == before:
                time.sleep(self.retry_delay)  # nothing came on that request: not a tight loop

    def _fetch_from(
        self, manifest: Manifest, staging: Staging, url: str, first: int, a: Pieces, watch: DownloadWatch | None
    ) -> None:
        index, buf = self._partial if self._partial[0] == first else (first, bytearray())
        start, stop = a.offset(first) + len(buf), first
        while stop < a.count and not staging.have[stop]:
            stop += 1  # this run of missing chunks: one Range request (chunks held already are not fetched)
        last = "" if stop == a.count else str(a.offset(stop) - 1)  # open-ended when the run reaches the end
        req = urllib.request.Request(url, headers={"Range": f"bytes={start}-{last}", "User-Agent": "edge-agent"})
        self.stats["requests"] += 1
        try:
            resp: http.client.HTTPResponse = urllib.request.urlopen(req, timeout=self.stall_timeout, context=self._ctx)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403, 410, 416):  # the server says no for good
                raise ArtifactRefused(f"{url}: HTTP {exc.code} {exc.reason}") from None
            if exc.code == 404:  # not there (yet): an artifact server still being filled
                raise ArtifactError(f"{url}: HTTP {exc.code} {exc.reason}") from None
            raise
        with resp:
            if resp.status == 200:
                index, buf = 0, bytearray()  # the server ignored Range: read from the start, skipping what we have
            elif resp.status != 206 or not resp.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
                raise ArtifactError(f"{url}: unexpected HTTP {resp.status} {resp.headers.get('Content-Range', '')}")
            _poll_reads(resp)
            end = a.count if resp.status == 200 else stop
            while index < end:
                n = a.chunk_len(index)
                complete = _read_into(resp, buf, n, watch)
                self.stats["received_bytes"] += len(buf) if complete else 0
                if not complete:
                    self._partial = (index, buf)  # timed out or cut: the next request resumes mid-chunk
                    return
                data, buf = bytes(buf), bytearray()
                if not staging.have[index]:
                    if not staging.write(index, data):
                        raise ArtifactRefused(
                            f"chunk {index} from {url} does not match the manifest's sha256: "
                            "corrupt or tampered source; nothing was installed"
                        )
                    self._report(manifest, staging)
                index += 1

    def _report(self, manifest: Manifest, staging: Staging) -> None:
        if self.progress:
            self.progress(
                "chunk",
                model=manifest.name,
                version=manifest.version,
                done=staging.bytes_have(),
                total=manifest.artifact.size,
            )


def _poll_reads(resp: http.client.HTTPResponse) -> None:
    """Reads of this response return within POLL_S (the socket's timeout), so deadlines and cancel are checked
    while a source trickles; a timed-out response is dropped and the next request resumes where it stopped."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(POLL_S)


def _read_into(resp: http.client.HTTPResponse, buf: bytearray, n: int, watch: DownloadWatch | None) -> bool:
    """Fill `buf` up to n bytes; False when the response ended, was cut or timed out first."""
    while len(buf) < n:
        try:
            block = resp.read1(min(n - len(buf), 1 << 16))
        except (OSError, ValueError, http.client.HTTPException):
            block = b""
        if watch is not None:
            watch.got(len(block))
            watch.check()
        if not block:
            return False
        buf += block
    return True
