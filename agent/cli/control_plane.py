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
        f"control plane on http://{cfg.host}:{cfg.port}/ (API /api/v1, schema /api/openapi.json), "
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


def _agent(agent_config: str):
    from agent.artifacts.keys import device_key
    from agent.config import load_config

    cfg = load_config(agent_config)
    return cfg, device_key(cfg.state_dir)


@control_plane.command("enroll")
@click.option("--agent-config", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--url", required=True, help="the control plane, e.g. http://cp:8470")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), help="a pre-shared enrollment token")
def enroll_cmd(agent_config: str, url: str, token_file: str | None) -> None:
    """On a device: ask the control plane to enroll this device (signed with its key)."""
    from agent.controlplane.client import post_json
    from agent.controlplane.enroll import request

    cfg, key = _agent(agent_config)
    token = Path(token_file).read_text(encoding="utf-8").strip() if token_file else None
    doc = request(cfg.device_id, key, target=getattr(cfg, "target", None), token=token)
    click.echo(json.dumps(post_json(url, "/api/v1/enroll", doc)))


@control_plane.command("report")
@click.option("--agent-config", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--url", required=True)
def report(agent_config: str, url: str) -> None:
    """On a device: upload its decision records (state_dir/decisions/*.json), each signed with its key."""
    from agent.controlplane.client import upload_decisions

    cfg, key = _agent(agent_config)
    n = upload_decisions(url, cfg.device_id, key, Path(cfg.state_dir))
    if n is None:
        raise ConfigError(f"no decision records under {cfg.state_dir}/decisions")
    click.echo(f"uploaded {n} decision record(s)")
