"""`edge-agent release`: the agent's own releases as signed wheelhouses, installed side by side and trialled by
edge-agent-guard (docs/self-update.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click

ROOT_HELP = "Release root: releases/<version>/venv, current, previous, guard/."


def _trusted(paths):
    from agent.artifacts.keys import trusted_keys

    return trusted_keys(list(paths))


@click.group()
def release():
    """Build, verify, install and activate releases of edge-agent itself."""


@release.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Wheelhouse directory (replaced).")
@click.option("--key", required=True, type=click.Path(dir_okay=False, exists=True), help="Fleet private key.")
@click.option("--src", type=click.Path(file_okay=False, exists=True), help="edge-agent source (default: this one).")
@click.option("--no-deps", is_flag=True, help="Only the edge-agent wheel (installs over --base-venv).")
@click.option("--find-links", multiple=True, help="Also take dependency wheels from this directory or URL.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def build(out, key, src, no_deps, find_links, as_json):
    """pip wheel the agent and (unless --no-deps) every dependency for this platform into OUT, and sign
    OUT/release.json (each wheel's sha256 and size) with the fleet key."""
    from agent.artifacts.keys import load_private_key
    from agent.release.build import build as do_build
    from agent.release.build import default_source

    source = Path(src) if src else default_source()
    if source is None:
        raise click.UsageError("this agent is not a source checkout: give --src DIR")
    built = do_build(source, Path(out), load_private_key(key), deps=not no_deps, find_links=tuple(find_links))
    doc = {"out": str(built.out), "version": built.version, "wheels": built.wheels, "bytes": built.size,
           "key_id": built.manifest["sig"]["key_id"]}  # fmt: skip
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(f"wrote {built.out}: edge-agent {built.version}, {built.wheels} wheel(s), "
                   f"{built.size / 1e6:.1f} MB, signed by key {doc['key_id']}")  # fmt: skip


@release.command()
@click.argument("wheelhouse", type=click.Path(file_okay=False, exists=True))
@click.option("--trust", multiple=True, required=True, help="Trusted fleet public key (file, PEM or base64).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify(wheelhouse, trust, as_json):
    """Check WHEELHOUSE/release.json's signature and every wheel's sha256; exit 1 naming the first problem."""
    from agent.release.manifest import verify as do_verify

    doc = do_verify(Path(wheelhouse), _trusted(trust))
    out = {"version": doc["version"], "wheels": len(doc["wheels"]), "key_id": doc["sig"]["key_id"], "verified": True}
    click.echo(json.dumps(out) if as_json else f"verified edge-agent {out['version']}: {out['wheels']} wheel(s)")


@release.command()
@click.argument("wheelhouse", type=click.Path(file_okay=False, exists=True))
@click.option("--root", default="/opt/edge-agent", show_default=True, help=ROOT_HELP)
@click.option("--trust", multiple=True, required=True, help="Trusted fleet public key (file, PEM or base64).")
@click.option(
    "--base-venv",
    type=click.Path(file_okay=False, exists=True),
    help="For a --no-deps release: the venv whose packages it uses (default: the one this command runs in).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def install(wheelhouse, root, trust, base_venv, as_json):
    """Verify WHEELHOUSE, then build ROOT/releases/<version>/venv offline from it; the running release is not
    touched (activate it with `edge-agent release activate`)."""
    import sys

    from agent.release.install import install as do_install

    base = Path(base_venv) if base_venv else Path(sys.prefix)  # used only by a release without dependencies
    done = do_install(Path(root), Path(wheelhouse), _trusted(trust), base_venv=base)
    if as_json:
        click.echo(json.dumps(done))
    else:
        from agent.cli.table import duration

        took = "already installed" if done["reused"] else f"installed in {duration(done['install_s'])}"
        click.echo(f"release {done['version']} in {done['path']} ({took})")


@release.command()
@click.argument("version")
@click.option("--root", default="/opt/edge-agent", show_default=True, help=ROOT_HELP)
@click.option("--config", "config_path", default="/etc/edge-agent/agent.yaml", show_default=True, help="Agent config.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def activate(version, root, config_path, as_json):
    """Record each committed model's golden answer from the running agent, then ask edge-agent-guard to trial
    VERSION (ROOT/guard/request.json): it restarts the agent on VERSION and flips back unless it passes."""
    from agent.config import load_config
    from agent.release.trial import NotTrialable, ask

    try:
        doc = ask(Path(root), load_config(config_path, check_files=False).state_dir, version)
    except NotTrialable as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json.dumps(doc) if as_json else f"asked the guard to trial {version} "
               f"({len(doc['golden_models'])} golden request(s) recorded)")  # fmt: skip


@release.command(name="list")
@click.option("--root", default="/opt/edge-agent", show_default=True, help=ROOT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def list_(root, as_json):
    """The installed releases, which is current and previous, failed tries and bad marks."""
    from agent.cli.table import render_table
    from agent.release.install import releases

    rows = releases(Path(root))
    if as_json:
        click.echo(json.dumps(rows))
        return
    head = ("VERSION", "LINK", "FAILED TRIES", "BAD")
    body = [(r["version"], "current" if r["current"] else "previous" if r["previous"] else "",
             str(r["failed_tries"]), "bad" if r["bad"] else "") for r in rows]  # fmt: skip
    click.echo(render_table(head, body))


@release.command()
@click.option("--root", default="/opt/edge-agent", show_default=True, help=ROOT_HELP)
@click.option("--config", "config_path", default="/etc/edge-agent/agent.yaml", show_default=True, help="Agent config.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def reports(root, config_path, as_json):
    """The guard's trial reports, each signed by this device's key (signed once, kept beside the report)."""
    from agent.config import load_config
    from agent.release.reports import sign_reports

    docs = sign_reports(Path(root), load_config(config_path, check_files=False).state_dir)
    if as_json:
        click.echo(json.dumps(docs))
        return
    for d in docs:
        click.echo(f"{d.get('version')}: {d.get('result')}" + (f" ({d['reason']})" if d.get("reason") else ""))
