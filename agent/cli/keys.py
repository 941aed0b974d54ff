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


@keys.command()
@click.option("--config", "config_path", default="/etc/edge-agent/agent.yaml", show_default=True, help="Agent config.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def device(config_path, as_json):
    """Create (once) this device's own key in state_dir/device.key and print its public key: register it with
    the control plane (`edge-agent fleet register DEVICE --public-key FILE --group G --store STORE`)."""
    from agent.artifacts.keys import DEVICE_PUB_NAME, device_key, key_id, public_pem
    from agent.config import load_config

    cfg = load_config(config_path, check_files=False)
    pub = device_key(cfg.state_dir).public_key()
    doc = {
        "device_id": cfg.device_id,
        "key_id": key_id(pub),
        "public_key": public_pem(pub),
        "public_key_file": str(cfg.state_dir / DEVICE_PUB_NAME),
    }
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(f"device {doc['device_id']}: key id {doc['key_id']}; public key in {doc['public_key_file']}")
        click.echo(doc["public_key"], nl=False)
