"""The dashboard's template engine: Jinja2 with autoescape on for every template (whatever its name), and the
one error page every HTML error answer is rendered from (never text formatted into HTML by hand)."""

from __future__ import annotations

import datetime
from pathlib import Path

import jinja2
from fastapi.templating import Jinja2Templates

from agent.fleet import paired
from agent.fleet.outcome import ON_PROBATION, model_phase

HERE = Path(__file__).parent


def _when(ts: float | None) -> str:
    """A unix time as UTC text (the dashboard's one time format)."""
    if not ts:
        return "never"
    return datetime.datetime.fromtimestamp(float(ts), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True)
env.filters["when"] = _when
env.filters["paired"] = paired.deployment_words  # a trial's paired ratio and A/A floor, or "not measured" (issue 36)
env.filters["model_state"] = lambda m: model_phase(m)[1] if model_phase(m)[0] == ON_PROBATION else m.get("state")
templates = Jinja2Templates(env=env)


def render_error(status: int, message: str, op=None, csrf: str = "") -> str:
    """The error page's HTML (the message escaped like every other value)."""
    return env.get_template("error.html").render(status=status, message=message, op=op, fleet={}, csrf=csrf)
