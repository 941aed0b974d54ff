"""Runs the qualification engine for one deployment in a child process (isolate.py's runner) that can be
cancelled or timed out, at the build priority and under the memory limit; progress and questions come back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent import errors
from agent.errors import LifecycleError
from agent.isolate.runner import run_isolated
from agent.lifecycle.context import StepContext

NO_DEADLINE_S = 24 * 3600.0
DEADLINE_MARGIN_S = 5.0  # the state's deadline (ctx.check) fires before the runner's own timeout


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
    nice: int = 0,
    memory_max: int | None = None,
    answers: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, Any]:
    """harness.qualify in a child process; returns Decision.to_dict(). Cancellation/deadline kill the child.
    `overrides` (a manifest's `qualification`): `providers` replaces the candidate list, `tolerance` /
    `tolerances` refine the package's tolerances. `nice`: the child runs that many levels below us (its row
    workers inherit it); `memory_max`: what one model may use (each worker is killed over it); `answers`:
    what the child may ask us (e.g. "serving_requests", to record the serving load beside each row)."""
    kwargs = {
        "package_dir": package_dir,
        "profile": profile,
        "target_name": target_name,
        "cache_root": cache_root,
        "providers": providers,
        "options": {**(options or {}), **({"memory_max": memory_max} if memory_max else {})},
        "overrides": dict(overrides or {}),
    }
    remaining = ctx.remaining()
    res = run_isolated(
        "agent.lifecycle.qualifier:qualify_in_child",
        kwargs,
        timeout=NO_DEADLINE_S if remaining is None else remaining + DEADLINE_MARGIN_S,
        tag="qualify",
        progress=lambda event, **fields: ctx.report(event, **fields),
        check=ctx.check,
        nice=nice,
        memory_max=memory_max,
        answers=answers,
    )
    if res.ok:
        decision: dict[str, Any] = res.value
        return decision
    if res.kind == "crashed":
        raise LifecycleError(f"qualification process died: {res.error}")
    if res.kind == "memory":
        raise LifecycleError(f"qualification {res.error}")
    raise LifecycleError(f"qualification failed: {_user_text(res.error)}")


def _user_text(error: str | None) -> str:
    """The child's error without the class prefix when it is one of ours (its message is written for the user:
    `model.onnx: refused: ...`); a foreign exception keeps its type, which is part of what went wrong."""
    name, sep, rest = (error or "").partition(": ")
    ours = isinstance(getattr(errors, name, None), type) and issubclass(getattr(errors, name), errors.EdgeAgentError)
    return rest if sep and ours else (error or "")


def qualify_in_child(
    *,
    package_dir: str,
    profile: Any,
    target_name: str | None,
    cache_root: str,
    providers: list[str] | None,
    options: dict[str, Any],
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """The child's side: load the package, apply the manifest's overrides, qualify, return the record."""
    from agent.isolate.runner import child_progress
    from agent.package.load import load_package
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions

    pkg = load_package(package_dir)
    for key in ("tolerances", "tolerance"):
        if isinstance(overrides.get(key), dict):
            pkg.tolerances.update(overrides[key])
    if isinstance(overrides.get("providers"), list) and overrides["providers"]:
        providers = [str(p) for p in overrides["providers"]]
    target = _target(target_name, profile)

    def progress(event: str, **fields: Any) -> None:
        child_progress(event, **_plain(fields))

    # the daemon keeps no idle row session for a confirmation round: one row process at a time beside serving
    measuring = QualifyOptions(cache_dir=cache_root, **{"keep_sessions": False, **options})
    decision = qualify(pkg, profile, target, providers, options=measuring, progress=progress)
    return decision.to_dict()


def _target(name: str | None, profile: Any) -> Any:
    from agent import targets

    return targets.resolve(profile, name)


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in fields.items()}
