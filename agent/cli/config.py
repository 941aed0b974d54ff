"""`edge-agent config`: check a config file, show the stable default device id."""

from __future__ import annotations

import json
import sys

import click

from agent.config import DEFAULT_PATH, default_device_id, load_config
from agent.errors import ConfigError


@click.group("config")
def config():
    """Check agent configuration files (default location /etc/edge-agent/agent.yaml).

    \b
    Examples:
      edge-agent config check agent.yaml
      edge-agent config check agent.yaml --json
      edge-agent config device-id
    """


@config.command("check")
@click.argument("file", metavar="[FILE]", default=str(DEFAULT_PATH), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print {ok, config|error} as JSON.")
@click.option("--root", default="/", show_default=True, help="Where the default device id is read from.")
def check(file, as_json, root):
    """Validate FILE and print the resolved configuration (defaults filled in, paths absolute).

    Exits 0 when valid, 2 with `error: <key path>: <what was expected>` when not. Credential files are
    checked for existence, never printed.

    \b
    Examples:
      edge-agent config check agent.yaml && echo "valid: reload the daemon (systemctl reload edge-agent)"
      edge-agent config check agent.yaml --json | jq -r .ok
    """
    try:
        cfg = load_config(file, root=root)
    except ConfigError as exc:
        if not as_json:
            raise
        click.echo(json.dumps({"ok": False, "file": file, "error": str(exc)}, indent=2))
        sys.exit(exc.exit_code)  # click's Exit code is dropped under standalone_mode=False
    if as_json:
        click.echo(json.dumps({"ok": True, "file": file, "config": cfg.to_dict()}, indent=2))
        return
    for warning in cfg.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{file}: ok ({cfg.mode} mode)")
    _print_tree(cfg.to_dict(), exclude={"source", "warnings", "mode"})


def _print_tree(d: dict, indent: int = 0, exclude=frozenset()) -> None:
    pad = "  " * indent
    for key, value in d.items():
        if key in exclude:
            continue
        if isinstance(value, dict):
            click.echo(f"{pad}{key}:")
            _print_tree(value, indent + 1)
        elif isinstance(value, list):
            click.echo(f"{pad}{key}: [{', '.join(str(v) for v in value)}]")
        else:
            click.echo(f"{pad}{key}: {'null' if value is None else value}")


@config.command("device-id")
@click.option("--root", default="/", show_default=True, help="Read under this root (a sysroot) instead of /.")
@click.option("--json", "as_json", is_flag=True, help="Print {device_id, source} as JSON.")
def device_id(root, as_json):
    """Print the stable default device id (board serial, else /etc/machine-id) and its source."""
    found = default_device_id(root)
    if found is None:
        raise ConfigError(
            f"device_id: no stable id under {root} (/proc/device-tree/serial-number, "
            "/proc/cpuinfo Serial, /etc/machine-id); set device_id in the config"
        )
    if as_json:
        click.echo(json.dumps({"device_id": found[0], "source": found[1]}))
    else:
        click.echo(found[0])
