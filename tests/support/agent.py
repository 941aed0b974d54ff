"""make_agent: the one way tests build an in-process DeviceAgent (test config file, fast settings)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from support.daemon import fast, write_config

AGENT_ARGS = ("profile", "sysroot", "serve_http", "on_event", "notifier", "use_lock", "qualifier")


def make_agent(
    tmp_path: Path | None,
    *,
    config: Any = None,
    mqtt: dict | None = None,
    extra: dict | None = None,
    step_config: Any = None,
    start: bool = False,
    known_providers: list[str] | None = None,
    **settings: Any,
) -> Any:
    """A DeviceAgent on tmp_path's test config (write_config; `config`: an AgentConfig already loaded), with the
    fast settings (support.daemon.fast: cpu only, short probation) changed by `settings` (StepConfig fields, e.g.
    probation_s=1.0, swap="stop-then-start", providers=["cpu"]: qualify only these). DeviceAgent's own arguments
    (serve_http, on_event, qualifier, ...) pass through; `known_providers` is DeviceAgent's `providers` (available
    here: no background probe); `start`: started before it is returned."""
    from agent.app import DeviceAgent
    from agent.config import load_config

    agent_kw = {k: settings.pop(k) for k in AGENT_ARGS if k in settings}
    if config is None:
        assert tmp_path is not None, "make_agent needs tmp_path or config"
        config = load_config(write_config(tmp_path, mqtt=mqtt, extra=extra))
    steps = replace(step_config if step_config is not None else fast(), **settings)
    a = DeviceAgent(config, step_config=steps, providers=known_providers, **agent_kw)
    return a.start() if start else a


def queue_holder(agent: Any, hold: Any, held: Any, hold_s: float) -> Any:
    """A thread (not started) that takes the agent's qualification queue as "other" (someone else's
    qualification), sets `held`, and keeps its turn until `hold` is set (at most hold_s)."""
    import threading

    from agent.lifecycle.context import StepContext

    def occupy() -> None:
        with agent.steps.qualify_queue.turn("other", StepContext(None)):
            held.set()
            hold.wait(hold_s)

    return threading.Thread(target=occupy)
