"""`edge-agent-guard supervise`: run the agent from <root>/current as systemd would (restart on exit), and trial
each release the agent asks for (guard/request.json). `edge-agent-guard status --json`: links, trial, reports.
Standard library only; exit status 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from agent_guard import links
from agent_guard.child import Child, Notify
from agent_guard.trial import Limits, recover, run_trial


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-agent-guard", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sup = sub.add_parser("supervise", help="run the agent from ROOT/current and trial requested releases")
    sup.add_argument("--root", required=True, type=Path, help="release root (/opt/edge-agent)")
    sup.add_argument("--config", required=True, type=Path, help="the agent's config (/etc/edge-agent/agent.yaml)")
    sup.add_argument("--state-dir", required=True, type=Path, help="the agent's state_dir (status.json)")
    sup.add_argument("--ready-timeout", type=float, default=Limits.ready_s, help="seconds to READY=1")
    sup.add_argument("--stability", type=float, default=Limits.stability_s, help="seconds up after READY=1")
    sup.add_argument("--deadline", type=float, default=Limits.deadline_s, help="seconds for the whole trial")
    sup.add_argument("--max-tries", type=int, default=Limits.max_tries, help="failed tries before marked bad")
    sup.add_argument("--stop-timeout", type=float, default=Limits.stop_s, help="SIGTERM to SIGKILL, stopping N")
    sup.add_argument("--failed-stop-timeout", type=float, default=Limits.failed_stop_s, help="the same, a failed N+1")
    sup.add_argument("--restart-delay", type=float, default=5.0, help="seconds before restarting an exited agent")
    st = sub.add_parser("status", help="print the links, the trial in progress and the last reports")
    st.add_argument("--root", required=True, type=Path)
    st.add_argument("--json", action="store_true", help="print JSON")
    return p


def status(root: Path) -> dict[str, Any]:
    reports = sorted((root / "guard" / "reports").glob("*.json"))
    return {
        "current": links.target(root, links.CURRENT),
        "previous": links.target(root, links.PREVIOUS),
        "trial": links.read_json(root / "guard" / "trial.json"),
        "bad": sorted(p.stem for p in (root / "guard" / "bad").glob("*.json")),
        "reports": [links.read_json(p) for p in reports[-5:]],
    }


def supervise(args: argparse.Namespace) -> int:
    root: Path = args.root
    limits = Limits(
        args.ready_timeout, args.stability, args.deadline, args.max_tries, args.stop_timeout, args.failed_stop_timeout
    )
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    report = recover(root, limits.max_tries)
    if report:
        print(f"edge-agent-guard: recovered: {report['result']} ({report['reason']})", flush=True)
    notify = Notify()
    child = Child(root, args.config, notify, root / "guard" / "agent.log")
    try:
        child.start()
        exited_at: float | None = None
        while not stop["now"]:
            request = links.read_json(root / "guard" / "request.json")
            if request and isinstance(request.get("version"), str):
                report = run_trial(root, child, args.state_dir, request["version"], limits)
                print(
                    f"edge-agent-guard: trial of {report['version']}: {report['result']}"
                    f"{' (' + str(report['reason']) + ')' if report['reason'] else ''}",
                    flush=True,
                )
                continue
            notify.drain()  # as systemd does: a notify socket nobody reads fills up
            if not child.alive:
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at >= args.restart_delay:
                    child.start()
                    exited_at = None
            time.sleep(0.2)
    finally:
        child.stop(timeout_s=limits.stop_s)
        notify.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "status":
        doc = status(args.root)
        print(json.dumps(doc, indent=1) if args.json else f"current {doc['current']}, previous {doc['previous']}")
        return 0
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
