"""`fleet simulate --control-plane URL`: the options that put a simulated fleet on a running control plane, and
the lines that say how far its enrollment got (printed when it changes). The devices enroll and post by
themselves (agent.sim.simulator, agent.services.cpsync); `--accept` accepts the pending ones as an operator."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

ENROLL_TOKEN_ENV = "EDGE_AGENT_ENROLL_TOKEN"
KEYS = ("control_plane", "enroll_token_file", "accept", "cp_token_file")


def simulate_cp_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--token-file",
        "cp_token_file",
        type=click.Path(dir_okay=False),
        help="File holding the operator token --accept uses (default: $EDGE_AGENT_CP_TOKEN).",
    )(f)
    f = click.option(
        "--accept",
        is_flag=True,
        help="Accept the devices the control plane keeps pending, as an operator (POST "
        "/api/v1/devices/ID/accept with the --group groups; needs an operator token).",
    )(f)
    f = click.option(
        "--enroll-token-file",
        type=click.Path(dir_okay=False),
        help="File holding an enrollment token (one use per device): the devices are accepted at once, with the "
        f"token's groups (default: ${ENROLL_TOKEN_ENV}; neither: they wait as pending).",
    )(f)
    return click.option(
        "--control-plane",
        "control_plane",
        metavar="URL",
        help="Enroll every device with the control-plane service at URL and post its signed decision records "
        "and attestations there, as a daemon with `control_plane:` in agent.yaml does.",
    )(f)


class CpJoin:
    """What `--control-plane` adds to a simulation: the enrollment token read, the acceptor, the progress lines."""

    def __init__(self, kw: dict[str, Any], groups: list[str]):
        from agent.config.schema import first_line

        self.url: str | None = kw["control_plane"]
        self.enroll_token: str | None = None
        self.acceptor: Any = None
        self._said: dict[str, Any] | None = None
        if not self.url:
            used = [f"--{k.replace('cp_', '').replace('_', '-')}" for k in KEYS[1:] if kw[k]]
            if used:
                raise click.UsageError(f"{', '.join(used)}: only with --control-plane URL")
            return
        self.url = self.url.rstrip("/")
        if kw["enroll_token_file"]:
            self.enroll_token = first_line(Path(kw["enroll_token_file"]), "--enroll-token-file") or None
        else:
            self.enroll_token = os.environ.get(ENROLL_TOKEN_ENV) or None
        if kw["accept"]:
            from agent.cli.fleet_cp import _token
            from agent.sim.cpjoin import Acceptor

            self.acceptor = Acceptor(self.url, _token(kw["cp_token_file"]), groups)

    def tick(self, states: dict[str, dict[str, Any]], as_json: bool) -> None:
        """Accept what is pending (with --accept), then say how the enrollment stands when that changed."""
        from agent.sim.cpjoin import summary

        if not self.url:
            return
        if self.acceptor is not None:
            self.acceptor.tick(states)
        now = summary(states)
        if self.acceptor is not None and self.acceptor.errors:
            now["accept_refused"] = dict(sorted(self.acceptor.errors.items()))
        if now == self._said:
            return
        self._said = now
        if as_json:
            click.echo(json.dumps({"event": "control_plane", "url": self.url, **now}))
        else:
            click.echo(f"simulate: {_line(self.url, now, accepting=self.acceptor is not None)}")


def _line(url: str, s: dict[str, Any], accepting: bool) -> str:
    text = (
        f"control plane {url}: {s['accepted']} accepted, {s['pending']} pending, {s['rejected']} rejected, "
        f"{s['unanswered']} not answered yet; {s['posted']} decision record(s) posted"
    )
    if s["pending"] and not accepting:
        text += " (accept them on the dashboard's Pending page, or run with --accept)"
    if s["error"]:
        text += f"; last error {s['error']}"
    for dev, why in (s.get("accept_refused") or {}).items():
        text += f"; accept {dev} refused: {why}"
    return text
