"""`edge-agent-guard supervise`: run the agent from <root>/current as systemd would (restart on exit), or, with
`--systemd UNIT`, leave running it to systemd; and trial each release the agent asks for (guard/request.json).
`edge-agent-guard status --json`: links, trial, reports. Standard library only; exit status 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from agent_guard import links
from agent_guard.child import Child, Notify
from agent_guard.sdunit import Unit
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
    sup.add_argument("--broker-timeout", type=float, default=Limits.broker_s, help="READY=1 to a broker connection")
    sup.add_argument("--restart-delay", type=float, default=5.0, help="seconds before restarting an exited agent")
    sup.add_argument("--systemd", metavar="UNIT", help="the agent is this systemd unit: systemctl stops and starts it")
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


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        ready_s=args.ready_timeout, stability_s=args.stability, deadline_s=args.deadline, max_tries=args.max_tries,
        stop_s=args.stop_timeout, failed_stop_s=args.failed_stop_timeout, broker_s=args.broker_timeout,
    )  # fmt: skip


def _trial(root: Path, agent: Any, args: argparse.Namespace, limits: Limits) -> bool:
    """Run the trial asked for, if any; True when there was one."""
    request = links.read_json(root / "guard" / "request.json")
    if not (request and isinstance(request.get("version"), str)):
        return False
    report = run_trial(root, agent, args.state_dir, request["version"], limits)
    reason = f" ({report['reason']})" if report["reason"] else ""
    print(f"edge-agent-guard: trial of {report['version']}: {report['result']}{reason}", flush=True)
    return True


def supervise(args: argparse.Namespace) -> int:
    root: Path = args.root
    limits = _limits(args)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    report = recover(root, limits.max_tries)
    if report:
        print(f"edge-agent-guard: recovered: {report['result']} ({report['reason']})", flush=True)
    if args.systemd:
        return _under_systemd(root, Unit(args.systemd), args, limits, stop)
    notify = Notify()
    child = Child(root, args.config, notify, root / "guard" / "agent.log")
    try:
        child.start()
        exited_at: float | None = None
        while not stop["now"]:
            if _trial(root, child, args, limits):
                continue
            child.idle()
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


def _under_systemd(root: Path, unit: Unit, args: argparse.Namespace, limits: Limits, stop: dict) -> int:
    """systemd runs (and restarts) the agent's unit; the guard tells systemd it is ready once it has recovered
    (the agent's unit is ordered after it, so it never starts on a link a power cut left flipped), then trials."""
    _sd_notify("READY=1\nSTATUS=recovered; waiting for trials")
    while not stop["now"]:
        if not _trial(root, unit, args, limits):
            time.sleep(0.5)
    return 0


def _sd_notify(message: str) -> None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    addr = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), addr)
        except OSError:
            pass  # no service manager listening: nothing to tell


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "status":
        doc = status(args.root)
        print(json.dumps(doc, indent=1) if args.json else f"current {doc['current']}, previous {doc['previous']}")
        return 0
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
