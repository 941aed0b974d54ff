"""`edge-agent fleet unjudged [ROLLOUT_ID] --control-plane URL [--accept | --roll-back]`: the devices of the
service's rollouts whose probation could not judge the version, holding their wave, and the operator's word."""

from __future__ import annotations

import json
from typing import Any

import click

from agent.cli.fleet_cp import _token, control_plane_options
from agent.errors import ConfigError


@click.command("unjudged")
@click.argument("rollout_id", required=False)
@click.option(
    "--accept", "word", flag_value="accept-unjudged", help="Keep the version on them: the held wave advances."
)
@click.option(
    "--roll-back",
    "word",
    flag_value="rollback-unjudged",
    help="Send those devices alone back to their previous version; the wave advances once they answered.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rollouts as JSON.")
@control_plane_options
def unjudged(rollout_id, word, as_json, control_plane=None, cp_token_file=None):
    """List the devices not judged of ROLLOUT_ID (without it: of every rollout of the control-plane service
    that waits for one): their probation could not tell whether the version is slower, and their wave waits
    for an operator's word ("waiting for operator: N devices not judged"). With --accept or --roll-back (and
    ROLLOUT_ID), give that word: the service applies it to every device then waiting, within a tick, and its
    audit log names you."""
    from agent.transport.cpclient import call

    if not control_plane:
        raise ConfigError("fleet unjudged works through the control-plane service: give --control-plane URL")
    if word and not rollout_id:
        raise ConfigError("--accept and --roll-back need the ROLLOUT_ID they answer")
    token = _token(cp_token_file)
    if word:
        call(control_plane, "POST", f"/api/v1/rollouts/{rollout_id}/{word}", token=token)
    if rollout_id:
        docs = [call(control_plane, "GET", f"/api/v1/rollouts/{rollout_id}", token=token)]
    else:
        brief = call(control_plane, "GET", "/api/v1/rollouts", token=token)["rollouts"]
        ids = [r["rollout_id"] for r in brief if r.get("waiting_for_operator")]
        docs = [call(control_plane, "GET", f"/api/v1/rollouts/{rid}", token=token) for rid in ids]
    if as_json:
        click.echo(json.dumps({"rollouts": docs}, indent=2, sort_keys=True))
        return
    click.echo("\n".join(render(d) for d in docs) or "no rollout waits for an operator's word")


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
