"""Runs the qualification engine for one deployment in a child process (`python -m agent.lifecycle.qualifier`)
that can be cancelled or timed out; results and progress come back over a pipe."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle.actions import StepContext

POLL_S = 0.2


def run_qualification(
    package_dir: str,
    profile: Any,
    target_name: str | None,
    cache_root: str,
    ctx: StepContext,
    *,
    providers: list[str] | None = None,
    options: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """harness.qualify in a child process; returns Decision.to_dict(). Cancellation/deadline kill the child.
    `overrides` (a manifest's `qualification`): `providers` replaces the candidate list, `tolerance` /
    `tolerances` refine the package's tolerances."""
    args = (package_dir, profile, target_name, cache_root, providers, dict(options or {}), dict(overrides or {}))
    rfd, wfd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.lifecycle.qualifier", str(wfd), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(wfd,),
            close_fds=True,
        )
    except OSError as exc:
        os.close(rfd)
        raise LifecycleError(f"cannot start the qualification process: {exc}") from None
    finally:
        os.close(wfd)
    recv = Connection(rfd, writable=False)
    stderr: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
    drain.start()
    try:
        proc.stdin.write(pickle.dumps(args))
        proc.stdin.close()
        return _collect(proc, recv, ctx, stderr)
    except BrokenPipeError:
        return _collect(proc, recv, ctx, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        drain.join(5)
        recv.close()


def _collect(proc, recv, ctx: StepContext, stderr: list[bytes]) -> dict[str, Any]:
    while True:
        ctx.check()
        try:
            ready = recv.poll(POLL_S)
        except (EOFError, OSError):
            break
        if ready:
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
        elif proc.poll() is not None:
            try:  # the child may have sent its result and exited between poll() and this check: read it first
                if recv.poll(0):
                    continue  # a result, or EOF (then recv() raises and the loop ends)
            except (EOFError, OSError):
                pass
            break
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    tail = b"".join(stderr).decode("utf-8", "replace").strip().splitlines()[-3:]
    detail = f": {' | '.join(tail)}" if tail else ""
    raise LifecycleError(f"qualification process died ({_describe(proc.returncode)}){detail}")


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


def _child(
    conn, package_dir, profile, target_name, cache_root, providers, options, overrides
) -> None:  # pragma: no cover
    try:
        from agent.qualify.harness import qualify
        from agent.qualify.package import load_package

        pkg = load_package(package_dir)
        for key in ("tolerances", "tolerance"):
            if isinstance(overrides.get(key), dict):
                pkg.tolerances.update(overrides[key])
        if isinstance(overrides.get("providers"), list) and overrides["providers"]:
            providers = [str(p) for p in overrides["providers"]]
        target = _target(target_name, profile)

        def progress(event: str, **fields: Any) -> None:
            conn.send(("progress", {"event": event, **_plain(fields)}))

        decision = qualify(
            pkg, profile, target, providers=providers, cache_dir=cache_root, progress=progress, **options
        )
        conn.send(("result", decision.to_dict()))
    except EdgeAgentError as exc:
        conn.send(("error", str(exc)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def main(argv: list[str]) -> None:  # pragma: no cover - runs in the child
    wfd, parent = int(argv[0]), int(argv[1])
    _die_with_parent()
    if os.getppid() != parent:
        os._exit(3)  # the daemon died before we could arm PDEATHSIG
    args = pickle.loads(sys.stdin.buffer.read())
    conn = Connection(wfd, readable=False)
    _child(conn, *args)
    sys.stdout.flush()
    os._exit(0)


def _target(name: str | None, profile: Any):
    from agent import targets

    return targets.get_target(name) if name else targets.match(profile)


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in fields.items()}


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
