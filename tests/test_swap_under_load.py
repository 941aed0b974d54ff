"""Hot swap under continuous HTTP load: zero failed requests, and model_version switches exactly at the swap."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
from support.serving import open_session

from agent.samples import tiny_model
from agent.serving.http.server import OIPServer
from agent.serving.registry import ModelRegistry

CLIENTS = 4
SWAPS = 24
MIN_REQUESTS_PER_SWAP = 3  # every client sees traffic on every version window


def _client(port, k, state, log, errors, stop):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    x = float(k)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [x] * 4}]})
    try:
        while not stop.is_set():
            floor = state["committed"]  # activate() returned for this version before the request was sent
            conn.request("POST", "/v2/models/m/infer", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                errors.append((r.status, data))
                continue
            doc = json.loads(data)
            version = int(doc["model_version"])
            y = doc["outputs"][0]["data"]
            log.append((floor, version, y))
            with state["lock"]:
                state["count"] += 1
                state["cond"].notify_all()
    except Exception as exc:  # noqa: BLE001 - any transport failure is a failed request
        errors.append(("exception", repr(exc)))
    finally:
        conn.close()


def _wait_for_traffic(state, n):
    with state["lock"]:
        target = state["count"] + n
        assert state["cond"].wait_for(lambda: state["count"] >= target, timeout=60), "clients stalled"


def test_swaps_under_load_fail_nothing_and_switch_exactly(tmp_path):
    # two model files, activated alternately under increasing version labels: bias == version label
    reg = ModelRegistry(drain_timeout=30)
    reg.activate("m", "1", open_session(tiny_model(1.0), tmp_path, "v1.onnx"))
    srv = OIPServer(reg, port=0).start()
    lock = threading.Lock()
    state = {"committed": 1, "lock": lock, "cond": threading.Condition(lock), "count": 0}
    logs = [[] for _ in range(CLIENTS)]
    errors: list = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client, args=(srv.port, k, state, logs[k], errors, stop)) for k in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    swaps = []
    try:
        _wait_for_traffic(state, CLIENTS * MIN_REQUESTS_PER_SWAP)
        for v in range(2, SWAPS + 2):
            session = open_session(tiny_model(float(v)), tmp_path / str(v))  # make ...
            swaps.append(reg.activate("m", str(v), session))  # ... before break
            state["committed"] = v
            _wait_for_traffic(state, CLIENTS * MIN_REQUESTS_PER_SWAP)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        srv.shutdown(10)
    assert errors == []
    assert all(s["drained"] and s["close_error"] is None for s in swaps)
    assert [s["previous"] for s in swaps] == [str(v) for v in range(1, SWAPS + 1)]
    seen = set()
    for k, log in enumerate(logs):
        assert log, f"client {k} made no request"
        versions = [v for _, v, _ in log]
        assert versions == sorted(versions), f"client {k} went back to an older version"
        for floor, version, y in log:
            assert version >= floor, f"client {k} got version {version} after {floor} was committed"
            np.testing.assert_array_equal(y, [k + version] * 4)  # the output is that version's: y = x + version
        seen.update(versions)
    assert seen == set(range(1, SWAPS + 2))
    stats = reg.stats("m")
    assert stats["errors"] == 0
    reg.close()


def test_rollback_style_swaps_between_two_versions_in_process(tmp_path):
    """Versions 1 and 2 alternate (deploy, roll back, ...); every response is consistent with the swaps."""
    reg = ModelRegistry(drain_timeout=30)
    label = {0: "1"}
    reg.activate("m", "1", open_session(tiny_model(1.0), tmp_path, "a0.onnx"))
    gen = {"now": 0, "next": 0}  # now: activate() returned; next: activation may have begun
    lock = threading.Lock()
    cond = threading.Condition(lock)
    count = {"n": 0}
    errors, logs, stop = [], [[] for _ in range(CLIENTS)], threading.Event()

    def client(k):
        feeds = {"x": np.full((1, 4), float(k), np.float32)}
        try:
            while not stop.is_set():
                floor = gen["now"]
                version, out = reg.infer("m", feeds)
                logs[k].append((floor, gen["next"], version, float(out["y"][0, 0])))
                with lock:
                    count["n"] += 1
                    cond.notify_all()
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    def traffic(n):
        with lock:
            target = count["n"] + n
            assert cond.wait_for(lambda: count["n"] >= target or errors, timeout=60)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        traffic(CLIENTS * 5)
        for g in range(1, 41):
            v = "2" if g % 2 else "1"
            session = open_session(tiny_model(float(v)), tmp_path, f"a{g}.onnx")
            label[g] = v
            gen["next"] = g
            reg.activate("m", v, session)
            gen["now"] = g
            traffic(CLIENTS * 5)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == []
    for k, log in enumerate(logs):
        for floor, ceiling, version, y in log:
            assert version in {label[g] for g in range(floor, ceiling + 1)}, (k, floor, ceiling, version)
            assert y == k + float(version)
    reg.close()
