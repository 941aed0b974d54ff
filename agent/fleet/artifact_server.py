"""ArtifactServer: answers chunk requests from the store (`edge-agent fleet serve`); safe to run several.

On MQTT 5 servers share `$share/edge-artifacts/{p}/artifacts/req/+`, so each request reaches one of them;
on MQTT 3.1.1 brokers (NATS) every server answers and the device drops duplicates by chunk index.
The reply topic comes from the request topic (never from the payload), so the ACL pins who can ask for what.
Nothing is sent twice for nothing: a chunk already sent to a device after its request arrived is not sent again
(a re-request that overtook a busy server), and a device whose will (`online: false`) arrived stops being
answered for requests it made before it died (a SIGKILLed or disconnected device does not drain the server).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.artifacts import chunks
from agent.artifacts.manifest import MAX_CHUNK
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError, TransportError
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import DEFAULT_PREFIX, Topics

if TYPE_CHECKING:  # pragma: no cover
    import paho.mqtt.client as paho

    from agent.artifacts.recipe import Layout
    from agent.fleet.blob_http import BlobServer

SentKey = tuple[str, str, int, int]  # (device, sha256, chunk_size, index) of an answer sent lately

MAX_REQUEST_BYTES = 64 * 1024 * 1024  # answers one request may cause
SENT_MEMORY = 65536  # (device, chunk) pairs remembered to skip re-requests already answered


class ArtifactServer:
    def __init__(
        self,
        store: ContentStore,
        broker: BrokerConfig,
        prefix: str = DEFAULT_PREFIX,
        *,
        workers: int = 2,
        max_outstanding: int = 32,
        progress: Callable[..., None] | None = None,
        client_id: str | None = None,
    ):
        self.store, self.topics = store, Topics(prefix)
        self.link = MqttLink(broker, client_id=client_id, max_inflight=max_outstanding, max_queued=100000)
        self.workers, self.max_outstanding, self.progress = workers, max_outstanding, progress
        self.requests: "queue.Queue[tuple[str, bytes, float]]" = queue.Queue(maxsize=4096)
        self.stats: collections.Counter[str] = collections.Counter()
        self._gone: dict[str, float] = {}  # device -> when its will / offline status arrived
        self._sent: collections.OrderedDict[SentKey, float] = collections.OrderedDict()
        self._sent_lock = threading.Lock()
        self._fds: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        self._fd_lock = threading.Lock()
        self._layouts: dict[str, Layout] = {}  # sha256 -> recipe.Layout, for requests by recipe index
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def shared(self) -> bool:
        return self.link.protocol == 5

    def start(self, wait: float = 15.0) -> "ArtifactServer":
        self.link.start(wait=wait)
        self.link.subscribe(self.topics.all_status(), self._on_status, qos=1)
        self.link.subscribe(self.topics.artifact_req_filter(shared=self.shared), self._on_request, qos=1)
        if wait:  # chunk requests are not retained: one sent before the broker took our subscription is lost
            self.link.wait_subscribed(wait)
        for n in range(self.workers):
            t = threading.Thread(target=self._work, name=f"artifact-server-{n}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self.link.stop()
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def serve_forever(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            if self.progress:
                self.progress("serve", connected=self.link.connected.is_set(), **dict(self.stats))

    # --- network thread: only enqueue -----------------------------------------------------------
    def _on_request(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            self.requests.put_nowait((topic, payload, time.monotonic()))
        except queue.Full:
            self.stats["dropped"] += 1  # the device re-requests after its timeout

    def _on_status(self, topic: str, payload: bytes, retained: bool) -> None:
        """A device's will or clean stop (`"online": false`): its earlier requests need no more answers."""
        if retained or len(payload) > 65536 or b"online" not in payload:
            return
        parsed = self.topics.parse(topic)
        try:
            online = json.loads(payload).get("online", True)
        except (ValueError, AttributeError, UnicodeDecodeError):
            return
        if parsed is not None and parsed.kind == "status" and online is False:
            assert parsed.device is not None  # Topics.parse: devices/<id>/status always names it
            self._gone[parsed.device] = time.monotonic()

    # --- workers --------------------------------------------------------------------------------
    def _work(self) -> None:
        infos: collections.deque[paho.MQTTMessageInfo] = collections.deque()
        while not self._stop.is_set():
            try:
                topic, payload, received = self.requests.get(timeout=0.5)
            except queue.Empty:
                continue
            parsed = self.topics.parse(topic)
            if parsed is None or parsed.kind != "artifact_req":
                self.stats["bad_topic"] += 1
                continue
            try:
                req = chunks.decode_request(payload)
            except ArtifactError:
                self.stats["bad_request"] += 1
                continue
            self.stats["requests"] += 1
            size = req.chunk_size or self._recipe_max(req.sha256)  # by recipe index: its longest chunk
            if req.chunk_size > MAX_CHUNK or size * len(req.indices) > MAX_REQUEST_BYTES:
                self.stats["bad_request"] += 1  # refuse amplification: one small request, gigabytes of answers
                continue
            assert parsed.device is not None  # Topics.parse: artifacts/req/<id> always names it
            self._serve(parsed.device, req, received, infos)

    def _serve(
        self, device: str, req: chunks.ChunkRequest, received: float, infos: collections.deque[paho.MQTTMessageInfo]
    ) -> None:
        reply = self.topics.artifacts(device)
        for n, index in enumerate(req.indices):
            if self._stop.is_set():
                return  # stopping: the device asks again (another server, or this one restarted)
            if self._gone.get(device, -1.0) > received:
                self.stats["cancelled"] += len(req.indices) - n  # the device died after asking: nobody listens
                return
            key = (device, req.sha256, req.chunk_size, index)
            if self._sent.get(key, -1.0) >= received:
                self.stats["superseded"] += 1  # sent after this request arrived: that answer covers it
                continue
            body = self._answer(req, index)
            while len(infos) >= self.max_outstanding:
                try:
                    infos.popleft().wait_for_publish(10)
                except (RuntimeError, ValueError):  # the broker went away: this worker lives on; devices re-ask
                    self.stats["publish_errors"] += 1
                    infos.clear()
                    return
            try:
                infos.append(self.link.publish(reply, body, qos=1))
            except (TransportError, ValueError, RuntimeError):  # queue full or link down: the device retries
                self.stats["publish_errors"] += 1
                return
            self._remember(key)

    def _remember(self, key: SentKey) -> None:
        with self._sent_lock:
            self._sent[key] = time.monotonic()
            self._sent.move_to_end(key)
            while len(self._sent) > SENT_MEMORY:
                self._sent.popitem(last=False)

    def _answer(self, req: chunks.ChunkRequest, index: int) -> bytes:
        fd = self._fd(req.sha256)
        if fd is None:
            self.stats["not_found"] += 1
            return chunks.encode_response(
                req.sha256,
                req.chunk_size,
                index,
                chunks.NOT_FOUND,
                f"artifact {req.sha256[:16]} is not in this server's store".encode(),
            )
        if req.chunk_size == chunks.RECIPE:
            span = self._recipe_span(req.sha256, index)
            if span is None:
                return chunks.encode_response(
                    req.sha256, 0, index, chunks.BAD_REQUEST, b"no recipe chunk with this index in this store"
                )
            data = os.pread(fd, span[1], span[0])
        else:
            data = os.pread(fd, req.chunk_size, index * req.chunk_size)
        if not data:
            return chunks.encode_response(req.sha256, req.chunk_size, index, chunks.BAD_REQUEST, b"index out of range")
        self.stats["chunks"] += 1
        self.stats["bytes"] += len(data)
        return chunks.response_header(req.sha256, req.chunk_size, index) + data

    def _layout(self, sha256: str) -> Layout | None:
        """The artifact's recipe.Layout (kept beside the store by fleet push; computed once if missing)."""
        from agent.artifacts.recipe import Layout, RecipeBook

        with self._fd_lock:
            layout = self._layouts.get(sha256)
            if layout is None:
                try:
                    rec = RecipeBook(self.store).ensure(sha256, None)
                except (OSError, ArtifactError):
                    rec = None
                if rec is None:
                    return None
                layout = self._layouts[sha256] = Layout.from_recipe(sha256, self.store.size(sha256), rec)
            return layout

    def _recipe_max(self, sha256: str) -> int:
        layout = self._layout(sha256)
        return max(layout.lens) if layout is not None else 1

    def _recipe_span(self, sha256: str, index: int) -> tuple[int, int] | None:
        """(offset, length) of chunk `index` of the artifact's recipe."""
        layout = self._layout(sha256)
        if layout is None or not 0 <= index < layout.count:
            return None
        return layout.offsets[index], layout.lens[index]

    def _fd(self, sha256: str) -> int | None:
        with self._fd_lock:
            fd = self._fds.get(sha256)
            if fd is not None:
                self._fds.move_to_end(sha256)
                return fd
            try:
                fd = os.open(self.store.path(sha256), os.O_RDONLY)
            except (OSError, ArtifactError):
                return None
            self._fds[sha256] = fd
            while len(self._fds) > 32:
                os.close(self._fds.popitem(last=False)[1])
            return fd


def serve_http(store: ContentStore, bind: str, **limits: Any) -> BlobServer:
    """Serve the store's blobs over HTTP (agent.fleet.blob_http: one event loop, bounded connections);
    returns the server (call .shutdown())."""
    from agent.fleet.blob_http import serve_http as serve

    return serve(store, bind, **limits)
