"""The dashboard's template engine: Jinja2 with autoescape on for every template (whatever its name), and the
one error page every HTML error answer is rendered from (never text formatted into HTML by hand). A value that is
missing (None) prints "not recorded", never a literal `None`, whatever the template forgot."""

from __future__ import annotations

import datetime
import json
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


NOT_RECORDED = "not recorded"


def _shown(value: object) -> object:
    """What a `{{ ... }}` prints: a missing value says so in words; a mapping or a list as JSON (its missing values
    `null`), never Python's repr with `None` in it."""
    if value is None:
        return NOT_RECORDED
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _brief(value: object, chars: int = 300) -> str:
    """`value` as `{{ }}` prints it, cut to `chars` characters."""
    text = str(_shown(value))
    return text if len(text) <= chars else text[: chars - 3] + "..."


env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True, finalize=_shown)
env.filters["when"] = _when
env.filters["brief"] = _brief
env.filters["paired"] = paired.deployment_words  # a trial's paired ratio and A/A floor, or "not measured" (issue 36)
env.filters["model_state"] = lambda m: model_phase(m)[1] if model_phase(m)[0] == ON_PROBATION else m.get("state")
templates = Jinja2Templates(env=env)


def render_error(status: int, message: str, op=None, csrf: str = "") -> str:
    """The error page's HTML (the message escaped like every other value)."""
    return env.get_template("error.html").render(status=status, message=message, op=op, fleet={}, csrf=csrf)
