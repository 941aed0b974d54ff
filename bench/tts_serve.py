"""The serving phase of bench/bench_tts.py: a real daemon (`edge-agent run --config`, started as the daemon tests
start it: tests/support/daemon.py, an inbox source, cpu only, a short probation) is given the Kokoro package, and
once it commits, inferences go through its HTTP API (KServe v2 binary extension both ways) at the golden length
and at the declared max; each answer is compared with onnxruntime run directly on the same inputs."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # as bench/bench_realmodels.py: the daemon tests' launcher


def infer_binary(url: str, model: str, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """One POST /v2/models/MODEL/infer with raw little-endian tensors after the JSON header, binary outputs back;
    returns the outputs and the request's wall time in ms."""
    from agent.serving.codec import datatype_of, numpy_dtype

    inputs = [
        {
            "name": k,
            "shape": list(v.shape),
            "datatype": datatype_of(v.dtype),
            "parameters": {"binary_data_size": v.nbytes},
        }
        for k, v in feeds.items()
    ]
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    body = head + b"".join(np.ascontiguousarray(v).tobytes() for v in feeds.values())
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, method="POST", headers=headers)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        raw, n = resp.read(), int(resp.headers["Inference-Header-Content-Length"])
    ms = (time.perf_counter() - t0) * 1e3
    doc, rest, out = json.loads(raw[:n]), raw[n:], {}
    for o in doc["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(rest[:size], numpy_dtype(o["datatype"]).newbyteorder("<")).reshape(o["shape"])
        rest = rest[size:]
    return out, ms


def serve(
    work: Path, pkg: Path, lengths: dict[str, dict[str, np.ndarray]], budget: str, requests: int, log: Callable
) -> None:
    """Start the daemon, drop `pkg` as kokoro/1, wait for its commit, print the qualification (journal wall time,
    decision record's latency per point), then serve each of `lengths` `requests` times against onnxruntime."""
    import onnxruntime as ort
    from support.daemon import Daemon, drop, write_config
    from support.wait import wait_for

    cfg = write_config(work / "daemon")
    state = work / "daemon" / "state"
    d = Daemon(cfg, state, env={"EDGE_AGENT_QUALIFY_PROVIDERS": "cpu", "EDGE_AGENT_QUALIFY_BUDGET_S": budget})
    try:
        d.wait_ready()
        t0 = time.monotonic()
        drop(state, "1", name="kokoro", writer=lambda dst: shutil.copytree(pkg, dst))

        def done() -> dict | None:
            dep = ((d.status() or {}).get("deployments") or {}).get("kokoro") or {}
            return dep if dep.get("result") else None

        dep = wait_for(done, 600, "kokoro 1 deployed", d.proc, step=0.5)
        log(f"daemon: kokoro 1 {dep['result']} {time.monotonic() - t0:.0f} s after the drop ({dep.get('reason')})")
        if dep["result"] != "committed":
            log(d.tail())
            raise SystemExit(1)
        journal = json.loads((state / "deployments" / f"{dep['id']}.json").read_text())
        window = journal["data"]["qualification"]
        log(f"daemon qualification: {window['finished'] - window['started']:.1f} s (queued {window['queued_s']:.2f} s)")
        swap = journal["data"].get("swap") or {}
        log(
            f"swap ({swap.get('mode')}): session {swap.get('session_s')} s, first warm-up answer "
            f"{swap.get('first_answer_s')} s; warm-up runs qualification's inputs (golden, opt, max) before serving"
        )
        decision = json.loads((state / "decisions" / f"{dep['id']}.json").read_text())
        (row,) = [r for r in decision["results"] if r["key"] == decision["selected_key"]]
        log(f"selected {decision['selected_key']}: {decision['reason']}")
        for p in row.get("latency_points") or []:
            fig = f"p50 {p['p50']:.1f} ms over {p['runs']} runs" if p.get("runs") else "no figure"
            log(f"    {p['point']} {p['inputs']}: {fig}; {p.get('stopped') or p.get('skipped') or ''}")

        url = (d.wait_ready().get("serving") or {})["url"]
        plain = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
        for label, feeds in lengths.items():
            t = time.perf_counter()
            want = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, feeds), strict=True))
            direct_ms = (time.perf_counter() - t) * 1e3
            times, diffs = [], []
            for _ in range(requests):
                got, ms = infer_binary(url, "kokoro", feeds)
                times.append(ms)
                for name, ref in want.items():
                    if got[name].shape != ref.shape:
                        diffs.append(f"{name}: shape {list(got[name].shape)} != {list(ref.shape)}")
                    else:
                        diff = float(np.max(np.abs(got[name].astype(np.float64) - ref))) if ref.size else 0.0
                        diffs.append(f"{name}{list(ref.shape)} max abs diff {diff:.3g}")
            log(
                f"served {label} tokens{list(feeds['tokens'].shape)}: median {statistics.median(times):.0f} ms over "
                f"{requests} requests (onnxruntime directly: {direct_ms:.0f} ms); {'; '.join(sorted(set(diffs)))}"
            )
    finally:
        rc = d.terminate()
        log(f"daemon stopped: exit {rc}")
