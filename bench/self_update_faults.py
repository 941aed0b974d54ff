"""The self-update fault campaign (issue 40): faults injected into a root-directory install driven by the test
supervisor (edge-agent-guard supervise), each of which must be rolled back to release N within 120 s with the
reason reported and the committed model serving again.

One device: a release root with N (built once by `release build --no-deps` from this source), a daemon on a real
Mosquitto serving a committed model (dropped into its inbox), the guard with short limits. Each fault is a new
release derived from N's wheelhouse by a small patch (agent.release.derive; a few ms), installed side by side and
activated. The kinds, in turn:

    import-crash     the release raises at `import agent`
    hang             it never sends READY=1
    no-broker        it connects to a dead port instead of its broker
    wrong-answer     it serves the committed model a different answer
    corrupt-wheel    a byte of its wheel flipped after signing: `release install` must refuse it
    power-cut        kill -9 of the guard and the agent right after a step of the swap (stopping, flipping,
                     starting, ready, rolling-back, in turn), then the guard started again as at boot

Time to rollback: from `release activate` (for a corrupted wheel: from `release install`) to N answering the
model again with `current` naming N. At the end every report is signed by the device key (`release reports`).

    .venv/bin/python bench/self_update_faults.py [--faults 100] [--work DIR] [--json]
Not run by the test suite (tests/test_self_update.py injects each kind once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

N = "1.0.0"
LIMIT_S = 120.0
KINDS = ("import-crash", "hang", "no-broker", "wrong-answer", "corrupt-wheel", "power-cut")
CUT_STEPS = ("stopping", "flipping", "starting", "ready", "rolling-back")
PATCHES = {  # kind -> (file in the wheel, text, replacement)
    "import-crash": ("agent/__init__.py", "", 'raise ImportError("injected: this release cannot import")\n'),
    "hang": (
        "agent/sdnotify.py",
        '        """READY=1 (once serving). Also sends MAINPID so `systemctl` tracks the right process."""\n',
        '        """READY=1 (once serving)."""\n        time.sleep(3600)  # injected: hangs before READY\n',
    ),
    "no-broker": (
        "agent/transport/device.py",
        "        self._mqtt = MqttLink(\n            broker,",
        '        self._mqtt = MqttLink(\n            BrokerConfig("mqtt://127.0.0.1:1"),  # injected: a dead port',
    ),
    "wrong-answer": (
        "agent/serving/registry.py",
        "        with self.hold(name, version) as run:\n            want = run.check(feeds, outputs)",
        "        feeds = {k: v + 1 for k, v in feeds.items()}  # injected: a wrong answer\n"
        "        with self.hold(name, version) as run:\n            want = run.check(feeds, outputs)",
    ),
}
REASONS = {
    "import-crash": "before READY=1",
    "hang": "no READY=1 within",
    "no-broker": "cannot reach the broker",
    "wrong-answer": "wrong answer: model tiny",
}
GUARD_ARGS = ["--ready-timeout", "10", "--stability", "3", "--deadline", "60", "--broker-timeout", "5",
              "--max-tries", "3", "--stop-timeout", "30", "--failed-stop-timeout", "3", "--restart-delay", "1"]  # fmt: skip


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, cwd=ROOT)
    if check and r.returncode != 0:
        raise RuntimeError(f"edge-agent {' '.join(args[:2])} failed: {r.stderr[-2000:]}")
    return r


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class Device:
    """The release root, the config (a real Mosquitto, the inbox named) and the guard as the supervisor."""

    def __init__(self, work: Path, broker_url: str):
        from support.daemon import write_config

        self.work, self.root, self.state = work, work / "opt", work / "etc" / "state"
        self.conf = write_config(work / "etc", mqtt={"url": broker_url}, extra={"inbox": str(self.state / "inbox")})
        self.guard: subprocess.Popen | None = None
        self.pub = work / "keys" / "fleet.pub"

    def install(self, wheelhouse: Path, check: bool = True) -> subprocess.CompletedProcess:
        return cli("release", "install", str(wheelhouse), "--root", str(self.root), "--trust", str(self.pub),
                   "--base-venv", str(Path(sys.prefix)), "--json", check=check)  # fmt: skip

    def start_guard(self, crash_at: str | None = None) -> None:
        from support.daemon import FAST_ENV

        env = {**os.environ, **FAST_ENV}
        env.pop("EDGE_AGENT_GUARD_CRASH_AT", None)
        if crash_at:
            env["EDGE_AGENT_GUARD_CRASH_AT"] = crash_at
        args = ["supervise", "--root", str(self.root), "--config", str(self.conf), "--state-dir", str(self.state)]
        with open(self.work / "guard.log", "ab") as log:
            self.guard = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "edge-agent-guard"), *args,
                                           *GUARD_ARGS], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)  # fmt: skip

    def stop_guard(self) -> None:
        if self.guard is not None and self.guard.poll() is None:
            self.guard.send_signal(signal.SIGTERM)
            self.guard.wait(120)

    def serving_n(self, timeout: float) -> bool:
        """N answers the committed model (version 1) and `current` names N, within timeout."""
        from support.daemon import infer

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            url = (_json(self.state / "status.json").get("serving") or {}).get("url")
            try:
                if url and os.readlink(self.root / "current").endswith(N) and infer(url)[0] == "1":
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def report(self, version: str, timeout: float) -> dict[str, Any] | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = sorted((self.root / "guard" / "reports").glob(f"*-{version}.json"))
            if found and _json(found[0]).get("result"):
                return _json(found[0])
            time.sleep(0.1)
        return None


def setup(work: Path, broker_url: str) -> tuple[Device, Path, Any]:
    """N built and installed, the guard supervising it, the model committed: (device, N's wheelhouse, key)."""
    from support.daemon import drop

    from agent.artifacts.keys import load_private_key

    cli("keys", "generate", "--out", str(work / "keys"))
    src = work / "src"
    for part in ("agent", "agent_guard", "hwtests", "targets"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "README.md", src / "README.md")
    text = (ROOT / "pyproject.toml").read_text()
    (src / "pyproject.toml").write_text(text.replace('version = "0.1.0"', f'version = "{N}"', 1))
    wheelhouse = work / f"wheelhouse-{N}"
    cli("release", "build", "--src", str(src), "--out", str(wheelhouse), "--key", str(work / "keys/fleet.key"),
        "--no-deps")  # fmt: skip
    dev = Device(work, broker_url)
    dev.install(wheelhouse)
    dev.start_guard()
    drop(dev.state, "1")
    if not dev.serving_n(300):
        raise RuntimeError(f"release {N} does not serve: see {work / 'guard.log'}")
    return dev, wheelhouse, load_private_key(work / "keys" / "fleet.key")


def plan(count: int) -> list[tuple[str, str | None]]:
    """(kind, power-cut step) for each fault: the kinds in turn, the power cuts over the steps in turn."""
    out, cuts = [], 0
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        step = None
        if kind == "power-cut":
            step, cuts = CUT_STEPS[cuts % len(CUT_STEPS)], cuts + 1
        out.append((kind, step))
    return out


def release_for(kind: str, step: str | None, version: str, base: Path, key: Any, work: Path) -> Path:
    from agent.release.derive import derive, replace_text

    fault = "import-crash" if step == "rolling-back" else kind  # a cut while rolling back needs a failing release
    patches = (replace_text(*PATCHES[fault]),) if fault in PATCHES else ()
    out = derive(base, work / "wheelhouses" / version, version, key, patches)
    if kind == "corrupt-wheel":
        whl = next(out.glob("*.whl"))
        data = bytearray(whl.read_bytes())
        data[len(data) // 2] ^= 0xFF
        whl.write_bytes(bytes(data))
    return out


def one_fault(dev: Device, kind: str, step: str | None, version: str, wheelhouse: Path) -> dict[str, Any]:
    """Inject one fault; {kind, step, version, ok, seconds, reason, why} (why: what went wrong, when not ok)."""
    row: dict[str, Any] = {"kind": kind, "step": step, "version": version, "ok": False, "reason": None}
    if kind == "corrupt-wheel":
        t0 = time.monotonic()
        r = dev.install(wheelhouse, check=False)
        refused = r.returncode != 0 and "digest" in r.stderr and not (dev.root / "releases" / version).exists()
        row["reason"] = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else None
        serving = row["serving"] = dev.serving_n(LIMIT_S)
        row["seconds"] = round(time.monotonic() - t0, 2)
        row["ok"], row["why"] = refused and serving, None if refused else f"not refused: {r.stderr[-300:]}"
        return row
    dev.install(wheelhouse)
    if step is not None:  # the hook is the guard's environment: start it again with it
        dev.stop_guard()
        dev.start_guard(crash_at=step)
        if not dev.serving_n(LIMIT_S):
            return {**row, "why": "N did not serve before the power cut"}
    t0 = time.monotonic()
    act = cli("release", "activate", version, "--root", str(dev.root), "--config", str(dev.conf), check=False)
    if act.returncode != 0:
        return {**row, "why": f"activate failed: {act.stderr[-300:]}"}
    if step is not None:
        assert dev.guard is not None
        try:
            dev.guard.wait(LIMIT_S)
        except subprocess.TimeoutExpired:
            return {**row, "why": f"the guard was not cut at step {step}"}
        dev.start_guard()  # power back: the guard recovers, then starts N
    return _rolled_back(dev, row, t0, REASONS.get(kind) or f"interrupted at step {step}")


def _rolled_back(dev: Device, row: dict[str, Any], t0: float, want: str) -> dict[str, Any]:
    rep = dev.report(row["version"], LIMIT_S)
    serving = row["serving"] = dev.serving_n(max(1.0, LIMIT_S - (time.monotonic() - t0)))
    row["seconds"] = round(time.monotonic() - t0, 2)
    if rep is None:
        return {**row, "why": "no report"}
    row["reason"] = rep.get("reason")
    problems = [
        f"result {rep.get('result')}" if rep.get("result") != "rolled-back" else "",
        f"reason {rep.get('reason')!r} lacks {want!r}" if want not in str(rep.get("reason")) else "",
        f"current {rep.get('current')}" if rep.get("current") != N else "",
        "N not serving" if not serving else "",
        f"{row['seconds']} s > {LIMIT_S:g} s" if row["seconds"] > LIMIT_S else "",
    ]
    why = "; ".join(p for p in problems if p)
    return {**row, "ok": not why, "why": why or None}


def summary(rows: list[dict[str, Any]], dev: Device, signed: int) -> dict[str, Any]:
    kinds: dict[str, dict[str, Any]] = {}
    for r in rows:
        name = r["kind"] + (f" at {r['step']}" if r["step"] else "")
        k = kinds.setdefault(name, {"injected": 0, "rolled_back": 0, "worst_s": 0.0})
        k["injected"] += 1
        k["rolled_back"] += int(r["ok"])
        k["worst_s"] = max(k["worst_s"], r.get("seconds") or 0.0)
    # each fault is one device's update: one that left N not serving within the limit counts, and so does the
    # device at the end (whatever the faults did to it, it serves N)
    left = sum(1 for r in rows if not r.get("serving")) + (0 if dev.serving_n(LIMIT_S) else 1)
    worst = max(rows, key=lambda r: r.get("seconds") or 0.0) if rows else {}
    return {"faults": len(rows), "rolled_back": sum(r["ok"] for r in rows), "kinds": kinds,
            "worst_s": worst.get("seconds"), "worst": f"{worst.get('kind')} {worst.get('step') or ''}".strip(),
            "signed_reports": signed, "devices_without_working_agent": left,
            "failures": [r for r in rows if not r["ok"]]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=100)
    ap.add_argument("--work", type=Path, help="working directory (default: a temporary one, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from brokers import Mosquitto

    work = args.work or Path(tempfile.mkdtemp(prefix="selfupdate-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with Mosquitto(work / "mosquitto") as broker:
        started = time.monotonic()
        dev, base, key = setup(work, broker.url)
        print(f"setup: release {N} serving in {time.monotonic() - started:.1f} s ({work})", flush=True)
        try:
            for i, (kind, step) in enumerate(plan(args.faults)):
                version = f"2.{i}.0"
                wheelhouse = release_for(kind, step, version, base, key, work)
                row = one_fault(dev, kind, step, version, wheelhouse)
                rows.append(row)
                flag = "ok " if row["ok"] else "BAD"
                why = f"  !! {row['why']}" if row.get("why") else ""
                print(f"{i + 1:3d} {version:8s} {kind:13s} {step or '':12s} {flag} {row.get('seconds', 0):6.1f} s  "
                      f"{row['reason'] or ''}{why}", flush=True)  # fmt: skip
                if not row["ok"] and not dev.serving_n(LIMIT_S):  # a fault left it broken: count it, go on from N
                    dev.stop_guard()
                    dev.start_guard()
            signed = len(json.loads(cli("release", "reports", "--root", str(dev.root), "--config", str(dev.conf),
                                        "--json").stdout))  # fmt: skip
            result = summary(rows, dev, signed)
            result["campaign_s"] = round(time.monotonic() - started, 1)
        finally:
            dev.stop_guard()
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    _print(result, args.json)
    return 0 if result["rolled_back"] == result["faults"] and not result["devices_without_working_agent"] else 1


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=1))
        return
    print(f"\n{result['faults']} faults injected, {result['rolled_back']} rolled back to {N} within {LIMIT_S:g} s "
          f"with the reason reported and the model serving again ({result['campaign_s']} s in all)")  # fmt: skip
    for name, k in result["kinds"].items():
        print(f"  {name:26s} {k['rolled_back']:3d}/{k['injected']:<3d} worst {k['worst_s']:6.1f} s")
    print(f"worst time to rollback: {result['worst_s']} s ({result['worst']})")
    print(f"trial reports signed by the device key: {result['signed_reports']}")
    print(f"devices left without a working agent: {result['devices_without_working_agent']}")
    for r in result["failures"]:
        print(f"  failed: {r['version']} {r['kind']} {r['step'] or ''}: {r['why']}")


if __name__ == "__main__":
    sys.exit(main())
