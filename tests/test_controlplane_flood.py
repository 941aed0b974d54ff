"""An enrollment flood against the real service process (`edge-agent control-plane --config`, issue 34 done-when):
1,000 unauthenticated enrollment requests of the maximum size (the body at the enrollment cap, `hardware` at its
16 KB cap), each from a new key, while an operator pages through /pending. The service's RSS (psutil, sampled
all along) stays under 512 MB, the pending cap holds (the oldest dropped, counted in /api/v1/health), and
/pending shows one page of 50, not every pending device."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
import yaml
from brokers import free_port
from cp_support import start_cp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_controlplane_service import _wait_up

from agent.controlplane.limits import Limits
from agent.transport.cpclient import enroll_request

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
REQUESTS, PENDING_MAX, RSS_MAX = 1000, 300, 512 * 1024 * 1024


def _max_size_body(i: int) -> bytes:
    """A signed enrollment request whose `hardware` is just under its cap, padded with JSON whitespace to the
    enrollment body cap exactly (the largest request the service takes)."""
    cap = Limits()
    hardware = {f"k{j:02d}": ["x" * 250] * 2 for j in range(31)}
    while len(json.dumps(hardware, separators=(",", ":"))) > cap.hardware_bytes:
        hardware.popitem()
    doc = enroll_request(f"flood-{i:04d}", Ed25519PrivateKey.generate(), hardware=hardware)
    body = json.dumps(doc).encode()
    assert len(body) <= cap.enroll_body_bytes
    return body + b" " * (cap.enroll_body_bytes - len(body))


def test_rss_stays_bounded_under_an_enrollment_flood_while_an_operator_browses_pending(tmp_path):
    port = free_port()
    cfg = tmp_path / "cp.yaml"
    limits = {"pending_max": PENDING_MAX, "address_burst": 10 * REQUESTS, "address_per_minute": 60 * REQUESTS}
    cfg.write_text(yaml.safe_dump({"store": "store", "listen": {"port": port}, "limits": limits}))
    log = tmp_path / "cp.log"
    proc = start_cp(cfg, log)
    url = f"http://127.0.0.1:{port}"
    peak, stop = [0], threading.Event()
    try:
        _wait_up(url, proc, log)
        service = psutil.Process(proc.pid)

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], service.memory_info().rss)
                time.sleep(0.05)

        token = (tmp_path / "admin.token").read_text().strip()
        pages: list[tuple[int, int]] = []

        def browse() -> None:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
                n = 0
                while not stop.is_set():
                    r = c.get("/pending", params={"page": n % 8})
                    pages.append((r.status_code, len(re.findall(r'data-device="', r.text))))
                    n += 1

        bodies = [_max_size_body(i) for i in range(REQUESTS)]
        watchers = [threading.Thread(target=sample), threading.Thread(target=browse)]
        for t in watchers:
            t.start()
        with httpx.Client(base_url=url, timeout=120) as anon, ThreadPoolExecutor(8) as pool:
            post = lambda b: anon.post("/api/v1/enroll", content=b, headers={"Content-Type": "application/json"})  # noqa: E731
            codes = [r.status_code for r in pool.map(post, bodies)]
        stop.set()
        for t in watchers:
            t.join(timeout=120)
        peak[0] = max(peak[0], service.memory_info().rss)
        assert codes == [202] * REQUESTS
        assert peak[0] < RSS_MAX, f"service RSS reached {peak[0] / 2**20:.0f} MiB"
        assert pages and all(code == 200 and rows <= 50 for code, rows in pages), pages[:5]
        headers = {"Authorization": f"Bearer {token}"}
        health = httpx.get(url + "/api/v1/health", headers=headers).json()["limits"]
        assert health["pending"] == PENDING_MAX and health["pending_dropped"] == REQUESTS - PENDING_MAX
        listed = httpx.get(url + "/api/v1/devices", params={"state": "pending", "limit": 1000}, headers=headers)
        ids = sorted(d["device_id"] for d in listed.json()["devices"])
        assert len(ids) == PENDING_MAX and listed.json()["total"] == PENDING_MAX
        first = httpx.get(url + "/pending", headers={"Authorization": f"Bearer {token}"}).text
        assert len(re.findall(r'data-device="', first)) == 50 and "?page=1" in first
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=60)
