"""The model repository extension (Triton's index, load, unload) on the device's own A/B slots, for both
front ends (it registers hooks on the serving DataPlane; serving never imports the lifecycle).

index: every model with a slot or serving, READY/UNAVAILABLE with the reason. load: serve the committed version
again (after an unload), or the named version when it is the committed or the previous slot's (the previous one
through a journaled rollback deployment). unload: stop serving the model; the mark (lifecycle.unloaded) is written
first and survives restarts. load and unload need the serving token: with none configured they are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import EdgeAgentError, ServingError
from agent.lifecycle import unloaded
from agent.lifecycle.slots import Slots
from agent.serving.errors import Conflict, Forbidden, InvalidInput, NotFound

if TYPE_CHECKING:
    from agent.lifecycle.orchestrator import Orchestrator
    from agent.lifecycle.steps import Steps
    from agent.serving.dataplane import DataPlane

ROLLBACK_WAIT_S = 120.0


class RepositoryService:
    def __init__(self, state_dir: str | Path, orchestrator: Orchestrator, steps: Steps, plane: DataPlane):
        self.state_dir = Path(state_dir)
        self.orchestrator, self.steps, self.plane = orchestrator, steps, plane
        self.registry = plane.registry

    def install(self) -> None:
        """Serve the extension on both transports and list it in server metadata."""
        self.plane.hooks["/v2/repository"] = self.http
        self.plane.grpc_hooks["repository"] = self.call
        if "model_repository" not in self.plane.extensions:
            self.plane.extensions.append("model_repository")

    # ---- transports -------------------------------------------------------------------------------------
    def http(self, path: str, doc: dict[str, Any]) -> Any:
        parts = path.strip("/").split("/")  # v2 repository index | v2 repository models NAME load|unload
        if parts == ["v2", "repository", "index"]:
            return self.call("index", doc)
        if len(parts) == 5 and parts[2] == "models" and parts[4] in ("load", "unload"):
            params = doc.get("parameters") or {}
            return self.call(parts[4], {"model_name": parts[3], "parameters": params})
        raise NotFound(f"no such endpoint: {path}")

    def call(self, method: str, doc: dict[str, Any]) -> Any:
        if method == "index":
            models = self.index(bool(doc.get("ready")))
            return {"models": models} if doc.get("_grpc") else models
        if self.plane.auth.token is None:
            raise Forbidden(f"repository {method} changes what the device serves: it needs serving.token_file set")
        name = doc.get("model_name")
        if not isinstance(name, str) or not name:
            raise InvalidInput("model_name is required")
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput("'parameters' must be an object")
        if method == "load":
            self.load(name, params)
        else:
            self.unload(name, params)
        return None

    # ---- actions ------------------------------------------------------------------------------------------
    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        serving = self.registry.models()
        out = []
        for name in sorted(set(self.steps.slots.names()) | set(serving)):
            committed = self.steps.slots.committed(name) if name in self.steps.slots.names() else None
            version = serving.get(name) or (committed.version if committed else "")
            if name in serving:
                out.append({"name": name, "version": version, "state": "READY", "reason": ""})
                continue
            if ready_only:
                continue
            if unloaded.held(self.state_dir, name, committed):
                why = "unloaded"
            else:
                why = self.steps.unavailable.get(name, "not serving")
            out.append({"name": name, "version": version, "state": "UNAVAILABLE", "reason": why})
        return out

    def _slots(self, name: str) -> Slots:
        if name not in self.steps.slots.names():
            raise NotFound(f"model {name!r} has no slot on this device; deploy it first")
        return self.steps.slots.get(name)

    def _idle(self, name: str) -> None:
        dep = self.orchestrator.in_flight().get(name)
        if dep is not None:
            raise Conflict(f"model {name!r} is being deployed ({dep.state.value}); wait or cancel it first")

    def load(self, name: str, params: dict[str, Any]) -> None:
        unknown = sorted(k for k in params if k != "version")
        if unknown:
            raise InvalidInput(
                f"load parameter(s) {unknown[:4]} not supported: models come from signed deployments, not "
                "from the request (parameters.version may name the committed or the previous slot)"
            )
        slots = self._slots(name)
        self._idle(name)
        committed, previous = slots["committed"], slots["previous"]
        have, before = (committed.version if committed else None), (previous.version if previous else None)
        want = str(params.get("version") or have or "")
        if want and want == have:
            unloaded.clear(self.state_dir, name)
            self.steps.ensure_committed(name)
            if name not in self.registry.models():
                raise ServingError(self.steps.unavailable.get(name, f"model {name!r} could not be served"))
            return
        if want and want == before:
            unloaded.clear(self.state_dir, name)
            try:
                dep = self.orchestrator.rollback(name, wait=ROLLBACK_WAIT_S)
            except EdgeAgentError as exc:
                raise InvalidInput(str(exc)) from None
            if dep.state.value != "committed":
                raise ServingError(f"loading version {want} of {name!r} failed: {dep.reason}")
            return
        raise InvalidInput(
            f"model {name!r} has no version {want!r} on this device; committed: {have}, previous: {before}"
        )

    def unload(self, name: str, params: dict[str, Any]) -> None:
        unknown = sorted(k for k in params if k != "unload_dependents")  # no ensembles here: no dependents
        if unknown:
            raise InvalidInput(f"unload parameter(s) {unknown[:4]} not supported")
        slots = self._slots(name)
        self._idle(name)
        committed = slots["committed"]
        unloaded.mark(self.state_dir, name, committed.sha256 if committed else None)  # persist, then act
        if name in self.registry.models():
            self.registry.deactivate(name)
