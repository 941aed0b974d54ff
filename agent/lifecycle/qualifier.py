"""Runs the qualification engine for one deployment in a child process that can be cancelled or timed out."""
from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle.actions import StepContext

POLL_S = 0.2


def run_qualification(package_dir: str, profile: Any, target_name: str | None, cache_root: str,
                      ctx: StepContext, *, providers: list[str] | None = None,
                      options: dict[str, Any] | None = None) -> dict[str, Any]:
    """harness.qualify in a spawned child; returns Decision.to_dict(). Cancellation/deadline kill the child."""
    mp = multiprocessing.get_context("spawn")
    recv, send = mp.Pipe(duplex=False)
    proc = mp.Process(target=_child, args=(send, package_dir, profile, target_name, cache_root, providers,
                                           dict(options or {})), name="edge-agent-qualify", daemon=True)
    proc.start()
    send.close()
    try:
        return _collect(proc, recv, ctx)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        recv.close()


def _collect(proc, recv, ctx: StepContext) -> dict[str, Any]:
    while True:
        ctx.check()
        if recv.poll(POLL_S):
            try:
                kind, payload = recv.recv()
            except (EOFError, OSError):
                break
            if kind == "progress":
                ctx.report(payload.pop("event", "qualify"), **payload)
            elif kind == "result":
                return payload
            elif kind == "error":
                raise LifecycleError(f"qualification failed: {payload}")
        elif not proc.is_alive():
            break
    proc.join(5)
    raise LifecycleError(f"qualification process died ({_describe(proc.exitcode)})")


def _describe(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when the daemon dies, so no orphan keeps qualifying."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(conn, package_dir, profile, target_name, cache_root, providers, options) -> None:  # pragma: no cover
    _die_with_parent()
    try:
        from agent.qualify.harness import qualify
        from agent.qualify.package import load_package

        pkg = load_package(package_dir)
        target = _target(target_name, profile)

        def progress(event: str, **fields: Any) -> None:
            conn.send(("progress", {"event": event, **_plain(fields)}))

        decision = qualify(pkg, profile, target, providers=providers, cache_dir=cache_root, progress=progress,
                           **options)
        conn.send(("result", decision.to_dict()))
    except EdgeAgentError as exc:
        conn.send(("error", str(exc)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()
        os._exit(0)


def _target(name: str | None, profile: Any):
    from agent import targets

    return targets.get_target(name) if name else targets.match(profile)


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in fields.items()}
