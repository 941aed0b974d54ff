"""HTTP load for the probation and shadow tests: keep-alive clients over real sockets (no tests here)."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import numpy as np


def body_for(name: str, x: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    ).encode()


class Load:
    """`clients` threads POSTing bodies[k % len(bodies)] to /v2/models/{model}/infer until stop(); every
    response is logged as (body index, status, model_version, first output's data or None)."""

    def __init__(self, url: str, model: str, bodies: list[bytes], clients: int = 4, keep: bool = False) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.model = parts.hostname, parts.port, model
        self.bodies, self.keep = bodies, keep
        self.log: list[tuple[int, int, str | None, list | None]] = []
        self.errors: list[str] = []
        self.count = 0
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self.threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in range(clients)]

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(60)

    def wait_requests(self, n: int, timeout: float = 120.0) -> None:
        with self._cond:
            target = self.count + n
            if not self._cond.wait_for(lambda: self.count >= target or self.errors, timeout):
                raise AssertionError(f"clients made fewer than {n} requests in {timeout}s")

    def _client(self, k: int) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        i = k
        path = f"/v2/models/{self.model}/infer"
        try:
            while not self._stop.is_set():
                j = i % len(self.bodies)
                i += len(self.threads)
                conn.request("POST", path, body=self.bodies[j], headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    self.errors.append(f"{r.status}: {data[:200]!r}")
                    continue
                doc = json.loads(data)
                out = doc["outputs"][0]["data"] if self.keep else None
                self.log.append((j, r.status, doc.get("model_version"), out))
                with self._cond:
                    self.count += 1
                    self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 - a transport failure is a failed request
            self.errors.append(f"exception: {exc!r}")
        finally:
            conn.close()


def send(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    """One request on its own connection: (status, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()
