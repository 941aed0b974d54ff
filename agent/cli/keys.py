"""`edge-agent keys`: fleet signing keys (Ed25519)."""

from __future__ import annotations

import json

import click


@click.group()
def keys():
    """Manage fleet signing keys (Ed25519)."""


@keys.command()
@click.option(
    "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory for fleet.key and fleet.pub."
)
@click.option("--force", is_flag=True, help="Overwrite an existing key pair.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def generate(out_dir, force, as_json):
    """Write DIR/fleet.key (private, mode 0600) and DIR/fleet.pub (give this one to devices)."""
    from agent.artifacts.keys import generate as gen

    key, pub, kid = gen(out_dir, overwrite=force)
    if as_json:
        click.echo(json.dumps({"private_key": str(key), "public_key": str(pub), "key_id": kid}))
    else:
        click.echo(f"wrote {key} (keep secret, mode 0600) and {pub}; key id {kid}")


@keys.command()
@click.argument("public_key", type=click.Path(dir_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def show(public_key, as_json):
    """Print the key id of a public key (the `key_id` manifests carry)."""
    from agent.artifacts.keys import key_id, load_public_key, raw_public_bytes

    pub = load_public_key(public_key)
    import base64

    doc = {"key_id": key_id(pub), "raw_base64": base64.b64encode(raw_public_bytes(pub)).decode()}
    click.echo(json.dumps(doc) if as_json else f"key id {doc['key_id']} (raw {doc['raw_base64']})")
