"""`edge-agent providers`: rank the execution providers for this device (or a capture) and explain each."""
from __future__ import annotations

import json

import click

from agent.errors import EdgeAgentError


def _target(profile, name: str | None):
    """The target to rank for: --target NAME, else the best match for the profile."""
    try:
        from agent import targets
    except ImportError as exc:
        if name:
            raise EdgeAgentError(f"targets are not available in this build: {exc}") from exc
        return None
    if name:
        return targets.get_target(name)
    try:
        return targets.match(profile)
    except EdgeAgentError as exc:  # a broken targets directory must not hide the providers
        click.echo(f"warning: no target matched ({exc}); listing providers without a preference order", err=True)
        return None


def _versions(versions: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items()) or "-"


@click.command("providers")
@click.option("--sysroot", type=click.Path(exists=True, file_okay=False), default=None,
              help="Read the hardware from a captured root filesystem instead of this host "
                   "(the runtimes are still this host's).")
@click.option("--target", "target_name", default=None, metavar="NAME",
              help="Rank for this target instead of the one matched from the hardware.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list of {name, available, reason, remedy, devices, options, versions, preferred}.")
def providers(sysroot, target_name, as_json):
    """Rank execution providers in the target's preference order and say why each is or is not usable.

    A provider is available only when the hardware (from the profile) and the installed runtime both allow
    it; unavailable ones come with a remedy. Providers the target does not list come last.
    """
    from agent.hardware import detect
    from agent.providers.ranking import rank

    profile = detect(sysroot or "/")
    target = _target(profile, target_name)
    results = rank(profile, target)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
        return
    _print_table(results, getattr(target, "name", None), sysroot)


def _print_table(results, target_name: str | None, sysroot: str | None) -> None:
    where = f"capture {sysroot}" if sysroot else "this host"
    click.echo(f"target: {target_name or 'none matched'} (hardware from {where}; runtimes from this host)")
    rows = [("#", "PROVIDER", "STATUS", "DEVICES", "VERSIONS")]
    for i, r in enumerate(results, 1):
        status = "available" if r.available else "unavailable"
        rows.append((str(i), r.name, status, ",".join(r.devices) or "-", _versions(r.versions)))
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    for i, row in enumerate(rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
        if i == 0:
            continue
        r = results[i - 1]
        pad = " " * (widths[0] + 2)
        click.echo(f"{pad}{'why' if not r.available else 'ok'}: {r.reason}")
        if not r.available and r.remedy:
            click.echo(f"{pad}fix: {r.remedy}")
        if r.options:
            click.echo(f"{pad}options: {json.dumps(r.options, sort_keys=True)}")
        if not r.preferred:
            click.echo(f"{pad}(not in this target's preference list)")
