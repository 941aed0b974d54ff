"""The gRPC front's watchers: grpc.health.v1 polled from the data plane's readiness, and the cap and idle
watchdog of open ModelStreamInfer streams."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from grpc_health.v1 import health, health_pb2

from agent.serving.errors import PeerBusy

if TYPE_CHECKING:
    from agent.serving.dataplane import DataPlane


class Health(health.HealthServicer):
    """grpc.health.v1: "" and the inference service are SERVING while the data plane is ready (polled)."""

    def __init__(self, plane: DataPlane, service: str):
        super().__init__()
        self._plane, self._names = plane, ("", service)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="grpc-health", daemon=True)

    def start(self) -> None:
        self._poll_once()
        self._thread.start()

    def _poll_once(self) -> None:
        ok = self._plane.ready()
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self._names:
            self.set(name, status)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            self._poll_once()

    def stop(self) -> None:
        self._stop.set()
        self.enter_graceful_shutdown()


class Streams:
    """Open ModelStreamInfer streams: a cap on how many at once, and a watchdog that cancels idle ones."""

    def __init__(self, limit: int, idle_s: float):
        self.limit, self.idle_s = max(1, int(limit)), float(idle_s)
        self._lock = threading.Lock()
        self._open: dict[Any, float] = {}  # context -> when its last message arrived
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="grpc-streams", daemon=True)
        self._thread.start()

    def open(self, context: Any) -> None:
        with self._lock:
            if len(self._open) >= self.limit:
                raise PeerBusy(f"{self.limit} streams are open, the most this server keeps; retry shortly")
            self._open[context] = time.monotonic()

    def touch(self, context: Any) -> None:
        self._open[context] = time.monotonic()

    def close(self, context: Any) -> None:
        with self._lock:
            self._open.pop(context, None)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.idle_s / 4)):
            now = time.monotonic()
            with self._lock:
                idle = [c for c, t in self._open.items() if now - t > self.idle_s]
            for context in idle:
                context.cancel()  # the handler's iterator ends and its thread is free again

    def stop(self) -> None:
        self._stop.set()
