"""`edge-agent control-plane --config FILE`: the control-plane service; `token` makes an operator token;
`enroll` and `report` are the device side (a signed enrollment request, signed decision records)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from agent.errors import ConfigError


@click.group(name="control-plane", invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="control-plane YAML config")
@click.pass_context
def control_plane(ctx: click.Context, config_path: str | None) -> None:
    """Run the control-plane service (device registry, API, dashboard, rollouts).

    \b
    Examples:
      edge-agent control-plane --config cp.yaml
    The first start writes an admin token to admin_token_file (default: beside the store).
    """
    ctx.ensure_object(dict)
    ctx.obj["config"] = config_path
    if ctx.invoked_subcommand is not None:
        return
    if not config_path:
        raise click.UsageError("--config FILE is required to run the service")
    from agent.controlplane import settings
    from agent.controlplane.service import serve

    cfg = settings.load(config_path)
    click.echo(
        f"control plane on {cfg.scheme}://{cfg.host}:{cfg.port}/ (API /api/v1, schema /api/openapi.json), "
        f"database {cfg.database_url.split('@')[-1]}, admin token in {cfg.admin_token_file}",
        err=True,
    )
    serve(cfg)


@control_plane.command("token")
@click.option("--name", required=True)
@click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), required=True)
@click.pass_context
def token(ctx: click.Context, name: str, role: str) -> None:
    """Make an operator token in the service's database (printed once; only its hash is kept)."""
    from agent.controlplane import db, repo, settings, tokens

    if not ctx.obj.get("config"):
        raise click.UsageError("--config FILE is required (before the subcommand)")
    cfg = settings.load(ctx.obj["config"])
    engine = db.make_engine(cfg.database_url)
    db.migrate(engine)
    with db.write(db.sessions(engine)) as s:
        value = tokens.create_operator(s, name, role)
        repo.audit(s, "cli", "token.create", name, role=role)
    click.echo(value)


@control_plane.command("leader")
@click.option("--json", "as_json", is_flag=True, help="print the lease as JSON")
@click.pass_context
def leader(ctx: click.Context, as_json: bool) -> None:
    """Which replica leads the rollouts and the MQTT fan-out: the leader lease in the service's database (holder,
    fencing token, seconds until it expires)."""
    from agent.controlplane import db, settings
    from agent.controlplane.lease import read_state

    if not ctx.obj.get("config"):
        raise click.UsageError("--config FILE is required (before the subcommand)")
    cfg = settings.load(ctx.obj["config"])
    engine = db.make_engine(cfg.database_url)
    db.migrate(engine)
    try:
        doc = read_state(db.sessions(engine), lease_s=cfg.lease_s)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
        return
    from agent.cli.table import duration, render_fields

    click.echo(
        render_fields(
            [
                (
                    "leader",
                    doc["holder"]
                    or f"none now (a replica with a broker takes the lease within {duration(cfg.lease_s)})",
                ),
                ("last holder", doc.get("last_holder")),
                ("fence", doc["fence"]),
                ("held for", duration(doc.get("held_for_s"))),
                ("expires in", duration(doc.get("expires_in_s")) + (" unless renewed" if doc["holder"] else "")),
            ]
        )
    )


def _agent(agent_config: str):
    from agent.artifacts.keys import device_key
    from agent.config import load_config

    cfg = load_config(agent_config)
    return cfg, device_key(cfg.state_dir)


def _url(cfg, url: str | None) -> str:
    if url:
        return url
    if cfg.control_plane is None:
        raise click.UsageError("--url URL is required (the agent config has no control_plane.url)")
    return cfg.control_plane.url


@control_plane.command("enroll")
@click.option("--agent-config", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--url", help="the control plane, e.g. http://cp:8470 (default: the config's control_plane.url)")
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="a pre-shared enrollment token (default: the config's control_plane.token_file)",
)
def enroll_cmd(agent_config: str, url: str | None, token_file: str | None) -> None:
    """On a device: ask the control plane to enroll this device (signed with its key). A daemon whose config
    has a control_plane section does this by itself at start."""
    from agent.config.schema import first_line
    from agent.transport.cpclient import enroll

    cfg, key = _agent(agent_config)
    token: str | None = None
    if token_file:
        token = first_line(Path(token_file), "--token-file")
    else:
        token = cfg.control_plane.token() if cfg.control_plane is not None else None
    target = cfg.target if cfg.target != "auto" else None
    click.echo(json.dumps(enroll(_url(cfg, url), cfg.device_id, key, target=target, token=token)))


@control_plane.command("report")
@click.option("--agent-config", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--url", help="the control plane (default: the config's control_plane.url)")
def report(agent_config: str, url: str | None) -> None:
    """On a device: upload its decision records (state_dir/decisions/*.json), each signed with its key, with
    their attestations. A daemon whose config has a control_plane section does this by itself."""
    from agent.transport.cpclient import upload_decisions

    cfg, key = _agent(agent_config)
    n = upload_decisions(_url(cfg, url), cfg.device_id, key, Path(cfg.state_dir))
    if n is None:
        raise ConfigError(f"no decision records under {cfg.state_dir}/decisions")
    click.echo(f"uploaded {n} decision record(s)")
