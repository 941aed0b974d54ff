"""Progress of long CLI work on stderr: a line within 2 s of the start and at least every 5 s after (a heartbeat
repeats the current step with its elapsed time and estimate while nothing else is said), as text on a terminal
or a log, or as JSON lines with --json (stdout keeps the result document)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from agent.cli.table import duration

HEARTBEAT_S = 5.0
FIRST_S = 0.5  # a step set quietly is said if nothing else was said this long after the start


class Progress:
    """Call it as progress(event, **fields). `render(event, fields)` gives the text line (None: say nothing
    now); the heartbeat re-says the last step as `still: <line> (<elapsed>)`."""

    def __init__(
        self,
        command: str,
        render: Callable[[str, dict[str, Any]], str | None],
        as_json: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
        first_s: float = FIRST_S,
    ):
        self.command, self.render, self.as_json, self.heartbeat_s = command, render, as_json, heartbeat_s
        self.first_s = first_s
        self.t0 = time.monotonic()
        self._last_said = self.t0
        self._said_any = False
        self._step = "working"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cli-progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(1.0)

    def __call__(self, event: str, **fields: Any) -> None:
        line = self.render(event, fields)
        with self._lock:
            if line is not None:
                self._step = line.split(": ", 1)[-1]
            if line is None and not self.as_json:
                return
            self._say(event, fields, line)

    def quietly(self, line: str) -> None:
        """Make `line` the current step without saying it now: the heartbeat says it if nothing else is said
        within `first_s` of the start (or `heartbeat_s` later), so work that fails at once on bad input prints
        only its error, and slow work still shows a line within 2 s."""
        with self._lock:
            self._step = line.split(": ", 1)[-1]

    def _say(self, event: str, fields: dict[str, Any], line: str | None) -> None:
        now = time.monotonic()
        self._last_said, self._said_any = now, True
        if self.as_json:
            doc = {"progress": self.command, "event": event, "elapsed_s": round(now - self.t0, 2), **fields}
            if line is not None:
                doc["line"] = line  # the text a terminal shows for it
            click.echo(json.dumps(doc, default=str), err=True)
        elif line is not None:
            click.echo(line, err=True)
        sys.stderr.flush()

    def _beat(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                now = time.monotonic()
                if not self._said_any and now - self.t0 >= self.first_s:
                    self._say("start", {"step": self._step}, f"{self.command}: {self._step}")
                elif now - self._last_said >= self.heartbeat_s:
                    elapsed = now - self.t0
                    self._say(
                        "heartbeat", {"step": self._step}, f"{self.command}: still {self._step} ({duration(elapsed)})"
                    )


def eta(runs: int, target: int, elapsed_s: float, budget_s: float) -> float | None:
    """Seconds left in a timed-run phase: to the target run count at the pace so far, at most the budget left."""
    if runs <= 0 or elapsed_s <= 0:
        return None
    by_pace = (target - runs) * elapsed_s / runs
    return max(0.0, min(by_pace, budget_s - elapsed_s) if budget_s else by_pace)
