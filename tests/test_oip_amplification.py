"""Response amplification (issue 29 item 1): a large binary request that asks for JSON outputs is refused with a 413
naming the way out before any byte of the response is produced, and the server's peak RSS stays under a device's
serving.memory_max with 1 and with 4 such requests at once. The server runs in its own process (RSS measured apart)."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest
from oip_proc import served

MAX_BODY = 64 << 20  # the daemon's default body limit (the attack's 64 MiB request)
MEMORY_MAX = 768 << 20  # serving.memory_max of a 1 GB Raspberry Pi 4 (targets/raspberry-pi-4.yaml: 75%)
N = (60 << 20) // 4  # FP32 elements: a 60 MiB binary body for id32 (identity, shape [n])


def _post(port: int, body: bytes, headers: dict) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("POST", "/v2/models/id32/infer", body, headers)
        r = c.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if r.getheader("Content-Type", "").startswith("application/json") else {})
    finally:
        c.close()


def _request(binary_out: bool) -> tuple[bytes, dict]:
    x = np.ones(N, dtype=np.float32)
    doc = {"inputs": [{"name": "x", "shape": [N], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}]}
    if binary_out:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


@pytest.fixture(scope="module")
def srv():
    with served(max_body_bytes=MAX_BODY) as s:
        s.watch()
        yield s
        s.stop()
        print(
            f"\nserver RSS {s.rss0 >> 20} MiB at start, peak {s.rss_peak >> 20} MiB (memory_max {MEMORY_MAX >> 20} MiB)"
        )


@pytest.mark.parametrize("clients", [1, 4])
def test_json_outputs_of_a_large_binary_request_are_refused_within_memory_max(srv, clients):
    body, headers = _request(binary_out=False)
    results: list[tuple[int, dict]] = []
    threads = [threading.Thread(target=lambda: results.append(_post(srv.port, body, headers))) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == clients
    statuses = sorted(s for s, _ in results)
    assert all(s in (413, 503) for s in statuses), statuses
    assert 413 in statuses, statuses
    refused = next(doc for s, doc in results if s == 413)
    assert "binary outputs" in refused["error"] and "smaller batch" in refused["error"], refused
    assert srv.rss_peak < MEMORY_MAX, f"peak RSS {srv.rss_peak >> 20} MiB over memory_max {MEMORY_MAX >> 20} MiB"
    assert not srv.live_failures, srv.live_failures[:3]


def test_the_same_request_with_binary_outputs_is_served(srv):
    body, headers = _request(binary_out=True)
    status, _ = _post(srv.port, body, headers)
    assert status == 200
    assert srv.rss_peak < MEMORY_MAX, f"peak RSS {srv.rss_peak >> 20} MiB over memory_max {MEMORY_MAX >> 20} MiB"


def test_small_json_responses_still_served(srv):
    x = [1.0, 2.0, 3.0]
    doc = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": x}]}
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request("POST", "/v2/models/id32/infer", json.dumps(doc))
    r = c.getresponse()
    out = json.loads(r.read())
    assert r.status == 200 and out["outputs"][0]["data"] == x


def test_the_daemon_sizes_its_request_budget_from_memory_max(tmp_path):
    """`edge-agent run` with serving.memory_max 512M: the request memory budget (and so the largest response) is a
    quarter of it, not the 256 MiB default (bench/bench_amplification_daemon.py measures the peak RSS it gives)."""
    from support.daemon import Daemon, write_config
    from support.wait import wait_for

    from agent.serving.http.server import DEFAULT_BODY_BUDGET, body_budget_for

    assert body_budget_for(512 << 20) == 128 << 20 and body_budget_for(None) == DEFAULT_BODY_BUDGET
    assert body_budget_for(64 << 30) == DEFAULT_BODY_BUDGET and body_budget_for(100 << 20) == MAX_BODY
    serving = {"host": "127.0.0.1", "port": 0, "memory_max": "512M", "shadow": {"duration_s": 1.0}}
    d = Daemon(write_config(tmp_path, extra={"serving": serving}), tmp_path / "state")
    try:
        d.wait_ready()
        line = wait_for(
            lambda: next((ln for ln in d.tail().splitlines() if ln.startswith("memory ")), None), 60, "memory line"
        )
        assert f"memory_max={512 << 20}" in line and f"request_budget={128 << 20}" in line, line
    finally:
        assert d.terminate() == 0, d.tail()
