"""JSON output amplification (issue 29 item 1) against the real daemon: `edge-agent run` serving an FP32 [N, 4]
model, sent a ~60 MiB binary request that asks for JSON outputs, 1 and then 4 at once. Prints each answer's status
and message and the daemon's peak RSS, read from /proc/PID/status (VmHWM: the kernel's own high-water mark, and
VmRSS sampled every 20 ms), against serving.memory_max.

    .venv/bin/python bench/bench_amplification_daemon.py [--memory-max 768M] [--mib 60] [--json]
Not run by the test suite (tests/test_oip_amplification.py checks the same on the server alone, no wall time).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAST_ENV = {  # as tests/support/daemon.py: cpu only, short qualification and probation
    "EDGE_AGENT_PROBATION_S": "0.5",
    "EDGE_AGENT_QUALIFY_PROVIDERS": "cpu",
    "EDGE_AGENT_QUALIFY_BUDGET_S": "0.1",
}


def _proc_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field}")


def _relu_n4():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "amp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _status(state: Path, pid: int) -> dict:
    try:
        doc = json.loads((state / "status.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if doc.get("pid") == pid else {}


def _wait(what: str, check, proc: subprocess.Popen, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited {proc.returncode} waiting for {what}")
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def _post(port: int, body: bytes, headers: dict) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        c.request("POST", "/v2/models/amp/infer", body, headers)
        r = c.getresponse()
        data = r.read()
        try:
            msg = (
                json.loads(data).get("error", "")
                if r.getheader("Content-Type", "").startswith("application/json")
                else ""
            )
        except ValueError:
            msg = f"{len(data)} bytes"
        return r.status, msg or f"{len(data)} bytes"
    finally:
        c.close()


def main() -> None:
    import yaml

    from agent.samples import write_package
    from agent.util.sizes import parse_size

    ap = argparse.ArgumentParser()
    ap.add_argument("--memory-max", default="768M", help="serving.memory_max (a 1 GB Raspberry Pi 4: 75%%)")
    ap.add_argument("--mib", type=int, default=60, help="binary request body in MiB (the body limit is 64 MiB)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    memory_max = parse_size(args.memory_max)
    rows = (args.mib << 20) // 16
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        state = d / "state"
        cfg = {
            "device_id": "amp-1",
            "state_dir": str(state),
            "target": "generic-x86_64",
            "serving": {"host": "127.0.0.1", "port": 0, "memory_max": args.memory_max, "shadow": {"duration_s": 1.0}},
            "telemetry": {"interval_s": 0},
        }
        (d / "agent.yaml").write_text(yaml.safe_dump(cfg))
        log = open(d / "daemon.log", "ab")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--config", str(d / "agent.yaml")],
            cwd=ROOT,
            env={**os.environ, **FAST_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait("status.json", lambda: _status(state, proc.pid), proc)
            tmp_pkg = state / "inbox" / ".tmp-amp"
            write_package(tmp_pkg, _relu_n4(), name="amp", version="1", extra_yaml={"dynamic_dims": {"N": 4}})
            (state / "inbox" / "amp").mkdir(parents=True, exist_ok=True)
            os.rename(tmp_pkg, state / "inbox" / "amp" / "1")

            def committed():
                doc = _status(state, proc.pid)
                dep = (doc.get("deployments") or {}).get("amp") or {}
                url = (doc.get("serving") or {}).get("url")
                if dep.get("result") not in (None, "committed"):
                    raise SystemExit(f"deployment ended {dep}: {(d / 'daemon.log').read_text()[-2000:]}")
                return url if dep.get("result") == "committed" and not doc.get("in_flight") else None

            url = _wait("amp 1 committed", committed, proc)
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            x = np.ones((rows, 4), np.float32)
            head = json.dumps(
                {
                    "inputs": [
                        {
                            "name": "x",
                            "shape": [rows, 4],
                            "datatype": "FP32",
                            "parameters": {"binary_data_size": x.nbytes},
                        }
                    ]
                }
            ).encode()
            body, headers = head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}
            del x
            peak = {"sampled": _proc_kib(proc.pid, "VmRSS")}
            rss_start = peak["sampled"]
            stop = threading.Event()

            def sample():
                while not stop.wait(0.02):
                    peak["sampled"] = max(peak["sampled"], _proc_kib(proc.pid, "VmRSS"))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            phases = []
            for clients in (1, 4):
                results: list[tuple[int, str]] = []
                threads = [
                    threading.Thread(target=lambda: results.append(_post(port, body, headers))) for _ in range(clients)
                ]
                t0 = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                phases.append(
                    {
                        "clients": clients,
                        "answers": sorted(results),
                        "wall_s": round(time.perf_counter() - t0, 3),
                        "peak_rss_mib_sampled": round(peak["sampled"] / 2**20, 1),
                        "vmhwm_mib": round(_proc_kib(proc.pid, "VmHWM") / 2**20, 1),
                    }
                )
            stop.set()
            sampler.join()
            alive = proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            log.close()
    doc = {
        "request_body_mib": round(len(body) / 2**20, 1),
        "memory_max_mib": round(memory_max / 2**20, 1),
        "rss_before_mib": round(rss_start / 2**20, 1),
        "phases": phases,
        "daemon_alive_after": alive,
        "under_memory_max": all(p["vmhwm_mib"] * 2**20 < memory_max for p in phases),
        "how": "daemon VmHWM (kernel peak RSS, cumulative) and VmRSS sampled every 20 ms from /proc/PID/status",
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(doc, indent=2) if args.json else json.dumps(doc))


if __name__ == "__main__":
    main()
