"""ControlService: answers the control-file RPC (lifecycle.control: rollback, cancel) of a running daemon.

Each loop turn picks up state_dir/control/<id>.req.json; each request is served on its own thread (a rollback
waits for its deployment) and answered with <id>.done.json; a request is never raised into the loop.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import EdgeAgentError
from agent.lifecycle import control
from agent.lifecycle.states import State

if TYPE_CHECKING:
    from agent.lifecycle.orchestrator import Orchestrator
    from agent.serving.registry import ModelRegistry

ROLLBACK_WAIT_S = 120.0  # how long a rollback request waits for its deployment to end before answering


class ControlService:
    def __init__(self, state_dir: str | Path, orchestrator: Orchestrator, registry: ModelRegistry):
        self.state_dir = Path(state_dir)
        self.orchestrator, self.registry = orchestrator, registry
        self._busy: set[str] = set()  # requests being served (their answer is not written yet)

    def tick(self) -> None:
        for req_id, req in control.pending(self.state_dir):
            if req_id in self._busy:
                continue
            self._busy.add(req_id)
            threading.Thread(target=self.serve, args=(req_id, req), daemon=True, name=f"control-{req_id}").start()

    def serve(self, req_id: str, req: dict[str, Any] | None) -> dict[str, Any]:
        """Execute one request and write its answer (also returned)."""
        try:
            result = self._execute(req)
        except EdgeAgentError as exc:
            result = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - answered, never raised into a thread
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        control.answer(self.state_dir, req_id, result)
        self._busy.discard(req_id)
        return result

    def _execute(self, req: dict[str, Any] | None) -> dict[str, Any]:
        if not isinstance(req, dict) or req.get("op") not in control.OPS or not isinstance(req.get("model"), str):
            return {"ok": False, "error": "malformed control request"}
        if control.expired(req):
            return {"ok": False, "error": f"request older than {control.MAX_AGE_S:.0f}s: not executed"}
        if req["op"] == "rollback":
            return self._rollback(req["model"])
        return self._cancel(req["model"])

    def _rollback(self, model: str) -> dict[str, Any]:
        dep = self.orchestrator.rollback(model, wait=ROLLBACK_WAIT_S)
        ok = dep.state is State.COMMITTED or (dep.source.get("kind") != "rollback" and dep.state is State.ROLLED_BACK)
        return {
            "ok": ok,
            "deployment": dep.summary(),
            "model": dep.model,
            "serving": self.registry.models().get(dep.model),
            **({} if ok else {"error": dep.reason}),
        }

    def _cancel(self, model: str) -> dict[str, Any]:
        dep = self.orchestrator.cancel(model)
        if dep is None:
            return {"ok": False, "model": model, "error": f"nothing in flight for {model!r}"}
        return {"ok": True, "model": dep.model, "deployment": dep.summary()}
