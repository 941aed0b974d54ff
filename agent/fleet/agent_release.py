"""Agent releases rolled out like models (issue 40): one home for `kind: agent`. A release rides the model
machinery under the reserved artifact name `edge-agent` (the signed desired state on devices/ID/desired/edge-agent,
the chunked channel, cohorts, canary, waves, halt and rollback of agent.fleet.rollout); a device reports it in its
status as `agent_release` (agent.services.release_update), and `model_view` reads that section as the engine
reads a model's entries, so a failed trial is a failed device and a halt rolls a cohort back like a model's."""

from __future__ import annotations

from typing import Any

RELEASE_NAME = "edge-agent"  # the artifact name of agent releases: refused as a model name
KINDS = ("model", "agent")
TRIAL_BAD = ("rolled-back", "refused")  # the guard's report results that fail the trial (agent_guard.trial)
INSTALLING = ("received", "downloading", "installing")  # agent.services.release_update's steps before the trial
SECTION = "agent_release"  # the status document's section (agent.services.release_update.section)


def kind_of(name: str | None) -> str:
    return "agent" if name == RELEASE_NAME else "model"


def _short(value: Any, n: int = 300) -> str | None:
    return None if value is None else str(value)[:n]


def summary(status: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """(agent version, release summary) of a device's status: the version its release root's `current` names
    (else the `agent_version` it reports) and {current, previous, trial: {version, result, reason, try, ended,
    marked_bad, signed}, installing: {version, step, error}}; None without an `agent_release` section."""
    sec = status.get(SECTION) if isinstance(status, dict) else None
    agent_version = status.get("agent_version") if isinstance(status, dict) else None
    if not isinstance(sec, dict):
        return (_short(agent_version, 64) if agent_version is not None else None), None
    trial = sec.get("trial") if isinstance(sec.get("trial"), dict) else None
    out: dict[str, Any] = {"current": _short(sec.get("current"), 64), "previous": _short(sec.get("previous"), 64)}
    if trial is not None:
        out["trial"] = {
            "version": _short(trial.get("version"), 64),
            "result": _short(trial.get("result"), 32),
            "reason": _short(trial.get("reason")),
            "step": _short(trial.get("step"), 32),
            "try": trial.get("try") if isinstance(trial.get("try"), int) else None,
            "ended": trial.get("ended") if isinstance(trial.get("ended"), (int, float)) else None,
            "marked_bad": bool(trial.get("marked_bad")),
            "signed": isinstance(trial.get("sig"), dict),
        }
    inst = sec.get("installing") if isinstance(sec.get("installing"), dict) else None
    if inst is not None:
        out["installing"] = {k: _short(inst.get(k)) for k in ("version", "step", "error")}
    return out["current"] or _short(agent_version, 64), out


def trial_words(release: dict[str, Any] | None) -> str:
    """The dashboard's one line: 'trial 1.1.0: good', 'trial 1.1.0: rolled-back (reason)', 'installing 1.1.0'."""
    if not isinstance(release, dict):
        return ""
    inst = release.get("installing") or {}
    if inst.get("error"):
        return f"install of {inst.get('version')} failed: {inst.get('error')}"
    if inst.get("version") and inst.get("step") in INSTALLING:
        return f"installing {inst.get('version')} ({inst.get('step')})"
    trial = release.get("trial") or {}
    if not trial:
        return ""
    reason = f" ({trial['reason']})" if trial.get("reason") else ""
    return f"trial {trial.get('version')}: {trial.get('result') or trial.get('step')}{reason}"


def model_view(status: Any) -> Any:
    """The status with the agent release as the engine reads a model (agent.fleet.outcome): models[edge-agent]
    = the running release (on probation while its trial runs, with the one that ran before as `previous`, never
    one whose trial failed) and
    deployments[edge-agent] = a trial or an install that failed. Unsigned or foreign statuses pass unchanged."""
    if not isinstance(status, dict) or not isinstance(status.get(SECTION), dict):
        return status
    sec = status[SECTION]
    current = sec.get("current") or status.get("agent_version")
    trial = sec.get("trial") if isinstance(sec.get("trial"), dict) else {}
    running = trial.get("version") == current and not trial.get("result")  # N+1 up, its trial not over
    model: dict[str, Any] = {"version": current, "state": "probation" if running else "committed"}
    if sec.get("previous") and sec.get("previous") != current and not _flipped_back_from(sec["previous"], trial):
        model["previous"] = sec["previous"]
    if isinstance(sec.get("sha256"), str):
        model["sha256"] = sec["sha256"]
    out = {**status, "models": {**(status.get("models") or {}), RELEASE_NAME: model}}
    dep = _failed(sec, trial)
    deps = {k: v for k, v in (status.get("deployments") or {}).items() if k != RELEASE_NAME}
    out["deployments"] = {**deps, **({RELEASE_NAME: dep} if dep else {})}
    return out


def _flipped_back_from(previous: Any, trial: dict[str, Any]) -> bool:
    """Does the release root's `previous` name the release whose trial just failed here? The guard's flip back
    leaves `previous` naming the failed release (agent_guard.links.flip_back); a model's `previous` is a version
    that ran committed, and the engine reads it so (rollout_state.held_before: took it, then went back). A device
    whose own trial failed after a halt never took N+1: it is cancelled, not rolled back."""
    return trial.get("version") == previous and trial.get("result") in TRIAL_BAD


def _failed(sec: dict[str, Any], trial: dict[str, Any]) -> dict[str, Any] | None:
    inst: dict[str, Any] = sec["installing"] if isinstance(sec.get("installing"), dict) else {}
    if inst.get("error"):
        return {"version": inst.get("version"), "state": "failed", "reason": f"install: {inst['error']}"}
    if trial.get("result") in TRIAL_BAD:
        return {"version": trial.get("version"), "state": "failed", "reason": f"trial: {trial.get('reason')}"}
    return None


class ReleaseView:
    """A rollout link (agent.fleet.rollout.RolloutLink) whose statuses are read through model_view: the engine
    of a `kind: agent` rollout. Everything else is the link's."""

    def __init__(self, link: Any) -> None:
        self._link = link

    def statuses(self) -> dict[str, Any]:
        return {dev: model_view(doc) for dev, doc in self._link.statuses().items()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)
