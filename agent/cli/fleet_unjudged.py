"""`edge-agent fleet unjudged ROLLOUT_ID --control-plane URL [--accept | --roll-back]`: the devices of a service
rollout whose probation could not judge the version, holding their wave, and the operator's word on them."""

from __future__ import annotations

import json
from typing import Any

import click

from agent.cli.fleet_cp import _token, control_plane_options
from agent.errors import ConfigError


@click.command("unjudged")
@click.argument("rollout_id")
@click.option(
    "--accept", "word", flag_value="accept-unjudged", help="Keep the version on them: the held wave advances."
)
@click.option(
    "--roll-back",
    "word",
    flag_value="rollback-unjudged",
    help="Send those devices alone back to their previous version; the wave advances once they answered.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rollout as JSON.")
@control_plane_options
def unjudged(rollout_id, word, as_json, control_plane=None, cp_token_file=None):
    """List the devices of ROLLOUT_ID (a rollout of the control-plane service) that are not judged: their
    probation could not tell whether the version is slower, and their wave waits for an operator's word
    ("waiting for operator: N devices not judged"). With --accept or --roll-back, give that word (the service
    applies it to every device then waiting, within a tick; the audit log names you)."""
    from agent.transport.cpclient import call

    if not control_plane:
        raise ConfigError("fleet unjudged works through the control-plane service: give --control-plane URL")
    token = _token(cp_token_file)
    if word:
        call(control_plane, "POST", f"/api/v1/rollouts/{rollout_id}/{word}", token=token)
    doc = call(control_plane, "GET", f"/api/v1/rollouts/{rollout_id}", token=token)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    click.echo(render(doc))


def render(doc: dict[str, Any]) -> str:
    prog = doc.get("progress") or {}
    lines = [f"rollout {doc['rollout_id']}: {doc['model']} -> {doc['version']} ({doc['phase']}, {doc.get('state')})"]
    lines.append(f"  {doc.get('waiting_for_operator') or 'no device waits for an operator'}")
    held = set(prog.get("waiting_for_operator") or [])
    for d in prog.get("devices") or []:
        if d["device_id"] in held:
            lines.append(f"  {d['device_id']}: not judged - {d.get('reason') or ''}")
    if doc.get("unjudged_decision"):
        applied = (prog.get("unjudged") or {}).get("request") == doc["unjudged_decision"]
        lines.append(f"  operator's word: {doc['unjudged_decision']}" + ("" if applied else " (not applied yet)"))
    return "\n".join(lines)
