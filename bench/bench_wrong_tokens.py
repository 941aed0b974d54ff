"""Wrong tokens against the real daemon (issue 29 item 8): `edge-agent run` with serving.token_file, then --guesses
wrong tokens on one keep-alive connection from 127.0.0.1 as fast as answers come (Retry-After ignored). Prints how
many were compared (401) and how many refused uncompared (429), the compared guesses per second, and the
daemon's /metrics auth counters read from another loopback address (127.0.0.2, a peer in good standing). Also
starts the daemon with a 1-character token file: its exit status and message.

    .venv/bin/python bench/bench_wrong_tokens.py [--guesses 2000] [--json]
Not run by the test suite (tests/test_serving_auth.py checks the slow-down and the counters, no wall time).
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
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef"


def _config(d: Path, token: bytes) -> Path:
    import yaml

    (d / "token").write_bytes(token)
    (d / "token").chmod(0o600)
    cfg = {
        "device_id": "tok-1",
        "state_dir": str(d / "state"),
        "target": "generic-x86_64",
        "serving": {"host": "127.0.0.1", "port": 0, "token_file": str(d / "token")},
        "telemetry": {"interval_s": 0},
    }
    (d / "agent.yaml").write_text(yaml.safe_dump(cfg))
    return d / "agent.yaml"


def _url(state: Path, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            doc = json.loads((state / "status.json").read_bytes())
        except (OSError, ValueError):
            doc = {}
        url = (doc.get("serving") or {}).get("url") if doc.get("pid") == proc.pid else None
        if url:
            return url
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited {proc.returncode}")
        time.sleep(0.2)
    raise SystemExit("daemon URL never appeared")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--guesses", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    exe = [sys.executable, "-m", "agent", "run", "--config"]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        short = subprocess.run(exe + [str(_config(d, b"x\n"))], cwd=ROOT, capture_output=True, text=True, timeout=120)
        cfg = _config(d, TOKEN.encode() + b"\n")
        log = open(d / "daemon.log", "ab")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(exe + [str(cfg)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            port = int(_url(d / "state", proc).rsplit(":", 1)[1].split("/")[0])
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            statuses: Counter[int] = Counter()
            t0 = time.perf_counter()
            for n in range(args.guesses):
                c.request("GET", "/v2", headers={"Authorization": f"Bearer guess-{n:012d}-xxxxxxxxxx"})
                r = c.getresponse()
                r.read()
                statuses[r.status] += 1
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            elapsed = time.perf_counter() - t0
            c.close()
            m = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=("127.0.0.2", 0))
            m.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            r = m.getresponse()
            text = r.read().decode()
            metrics = [ln for ln in text.splitlines() if ln.startswith("edge_agent_auth_")]
            metrics_status = r.status
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            log.close()
    doc = {
        "short_token_start": {"exit": short.returncode, "stderr": short.stderr.strip().splitlines()[-1:]},
        "guesses_sent": args.guesses,
        "answers": dict(statuses),
        "elapsed_s": round(elapsed, 3),
        "compared_guesses_per_s": round(statuses[401] / elapsed, 2),
        "metrics_status": metrics_status,
        "metrics": metrics,
        "how": "client-side perf_counter around the loop, one keep-alive connection; /metrics from 127.0.0.2",
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(doc, indent=2) if args.json else json.dumps(doc))


if __name__ == "__main__":
    main()
