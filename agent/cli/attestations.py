"""`edge-agent attestation verify` (one file, offline) and `edge-agent fleet attestations` (all retained ones)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from agent.cli.broker_opts import broker_config, broker_options
from agent.errors import EdgeAgentError


@click.group()
def attestation():
    """Signed qualification evidence (in-toto Statements signed by a device's key)."""


@attestation.command("verify")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--device-key",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="The device's public key (device.pub).",
)
@click.option("--device", "device_id", metavar="ID", help="Also require the attestation to name this device.")
@click.option("--json", "as_json", is_flag=True, help="Print the verified statement as JSON.")
def verify(file, device_key, device_id, as_json):
    """Check FILE offline: signed by DEVICE_KEY, an in-toto Statement this agent writes."""
    from agent.artifacts.keys import load_public_key
    from agent.evidence.verify import verify_attestation

    try:
        summary = verify_attestation(Path(file).read_bytes(), load_public_key(device_key), device_id=device_id)
    except EdgeAgentError as exc:
        if as_json:
            click.echo(json.dumps({"verified": False, "reason": str(exc)}, indent=2))
        raise
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    click.echo(
        f"verified: {summary['kind']} of {summary['model']} {summary['version']} by device {summary['device']} "
        f"(sha256 {str((summary['digest'] or {}).get('sha256'))[:16]}, "
        + (f"selected {summary['selected']})" if summary["kind"] == "qualification" else f"{summary['verdict']})")
    )


@click.command("attestations")
@click.option("--device", "device_id", metavar="ID", help="Only this device.")
@click.option("--model", metavar="NAME", help="Only this model.")
@click.option("--store", required=True, type=click.Path(file_okay=False), help="Control-plane store (registry.json).")
@broker_options
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def fleet_attestations(device_id, model, store, as_json, **kw):
    """List the devices' retained attestations and verify each against its device key in the registry."""
    from agent.fleet.attestations import fleet_attestations as collect
    from agent.fleet.registry import require_registry

    registry = require_registry(store, "fleet attestations")
    rows = collect(broker_config(kw), registry, kw["prefix"], device=device_id, model=model)
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no attestations")
        return
    from agent.cli.table import render_table

    table = [
        (
            r["device"],
            r["model"],
            r.get("version"),
            r["kind"],
            r.get("selected") if r["kind"] == "qualification" else r.get("verdict"),
            "verified" if r.get("verified") else f"REFUSED: {r.get('reason')}",
        )
        for r in rows
    ]
    click.echo(render_table(("DEVICE", "MODEL", "VERSION", "KIND", "OUTCOME", "SIGNATURE"), table))
