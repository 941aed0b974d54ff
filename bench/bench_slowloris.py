"""Slowloris: a normal client's p99 under 300 slowloris + 1,000 idle keep-alive connections, as a ratio against
its unloaded p99 measured in the same run (before and after the crowd; goal <= 3x), and the worst
/v2/health/live answer time under the crowd (goal < 1 s). tests/test_oip_slowloris.py asserts the behaviour
(every request served, every probe answered); the latency figures live here.

    .venv/bin/python bench/bench_slowloris.py [--requests 700]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from oip_proc import served  # noqa: E402
from test_oip_slowloris import _client, _p99  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=700)
    args = ap.parse_args()
    with served(header_timeout=3.0) as srv:
        _client(srv.port, 100)  # warm-up
        before, _, _ = _client(srv.port, args.requests)
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        cmd = [sys.executable, str(TESTS / "oip_crowd.py"), "--port", str(srv.port), "--slow", "300", "--idle", "1000"]
        crowd = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        try:
            ready = json.loads(crowd.stdout.readline())  # type: ignore[union-attr]
            srv.watch()
            loaded, ok, failed = _client(srv.port, args.requests, min_s=8.0)
            srv.stop()
        finally:
            crowd.stdin.close()  # type: ignore[union-attr]
            stats = json.loads(crowd.stdout.readline() or "{}")  # type: ignore[union-attr]
            crowd.wait(30)
        after, _, _ = _client(srv.port, args.requests)
    unloaded = (_p99(before) + _p99(after)) / 2
    ratio = _p99(loaded) / unloaded
    print(f"crowd held: {ready.get('ready')} connections; {stats}")
    print(f"normal client under the crowd: {ok} ok / {failed} failed")
    print(
        f"p99 unloaded {_p99(before) * 1e3:.2f} / {_p99(after) * 1e3:.2f} ms, loaded {_p99(loaded) * 1e3:.2f} ms: "
        f"ratio {ratio:.2f}x (goal <= 3x) {'MET' if ratio <= 3 else 'MISSED'}"
    )
    print(f"/v2/health/live worst {srv.live_worst * 1e3:.0f} ms (goal < 1000 ms), failures {len(srv.live_failures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
