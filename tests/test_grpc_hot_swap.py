"""Hot swap and probation hold on gRPC as on HTTP: a gRPC client calling all through a deployment sees every answer
right, v1 then v2 and never an error; /metrics counts the gRPC calls by status code."""

from __future__ import annotations

import threading
import urllib.request

import numpy as np
import tritonclient.grpc as tg
from cp_support import commit_flagged_targets
from support.agent import make_agent
from support.daemon import deploy

X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


def test_grpc_clients_ride_through_a_swap(tmp_path, monkeypatch):
    # a short probation on a loaded host may not pair enough runs to judge: this test is about answers through the
    # swap, so its targets keep an unjudged version serving, flagged (the default, rollback: test_unjudged.py)
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(commit_flagged_targets(tmp_path)))
    a = make_agent(tmp_path, start=True)
    try:
        assert deploy(a, "1").state.value == "committed"
        c = tg.InferenceServerClient(a.grpc_server.target)
        x = tg.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(X)
        seen: list[tuple[str, float]] = []
        errors: list[str] = []
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                try:
                    r = c.infer("tiny", [x])
                    seen.append((r.get_response().model_version, float(r.as_numpy("y")[0, 0] - X[0, 0])))
                except Exception as exc:  # noqa: BLE001 - collected: the assertion names them
                    errors.append(repr(exc))

        t = threading.Thread(target=loop)
        t.start()
        try:
            assert deploy(a, "2").state.value == "committed"
        finally:
            stop.set()
            t.join(60)
        assert not errors, errors[:3]
        versions = [v for v, _ in seen]
        assert versions[0] == "1" and versions[-1] == "2", (versions[:3], versions[-3:])
        assert versions == sorted(versions)  # never back to v1 once v2 answered
        assert all(bias == float(v) for v, bias in seen)  # each answer from the version it names
        text = urllib.request.urlopen(f"{a.url}/metrics", timeout=30).read().decode()
        ok = next(line for line in text.splitlines() if line.startswith('edge_agent_grpc_responses_total{code="OK"}'))
        assert float(ok.split()[-1]) >= len(seen)
        c.close()
    finally:
        a.stop()
