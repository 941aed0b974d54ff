"""`edge-agent providers`: rank the execution providers for this device (or a capture) and explain each."""

from __future__ import annotations

import json

import click

from agent.errors import ConfigError, EdgeAgentError


def _target(profile, name: str | None):
    """The target to rank for: --target NAME, else the best match for the profile."""
    try:
        from agent import targets
    except ImportError as exc:
        if name:
            raise EdgeAgentError(f"targets are not available in this build: {exc}") from exc
        return None
    if name:
        return targets.resolve(profile, name)
    try:
        return targets.resolve(profile)
    except EdgeAgentError as exc:  # a broken targets directory must not hide the providers
        click.echo(f"warning: no target matched ({exc}); listing providers without a preference order", err=True)
        return None


def _cache():
    from agent.providers.opened import default_cache

    return default_cache()


def _versions(versions: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items()) or "-"


@click.command("providers")
@click.option(
    "--sysroot",
    metavar="DIR",
    default=None,
    help="Read the hardware from a captured root filesystem (a directory, or the .tar.gz that "
    "scripts/capture-sysroot.sh writes) instead of this host (the runtimes are still this host's).",
)
@click.option(
    "--target",
    "target_name",
    default=None,
    metavar="NAME",
    help="Rank for this target instead of the one matched from the hardware.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Also open a real session on each available provider and run a generated model through it.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON list of {name, available, reason, remedy, devices, options, versions, preferred, opened, "
    "expected}.",
)
def providers(sysroot, target_name, verify, as_json):
    """Rank execution providers in the target's preference order and say why each is or is not usable.

    A provider is available only when the hardware (from the profile) and the installed runtime both allow
    it and a session on a tiny model opened on it here (cached per runtime version and profile); unavailable
    ones come with a remedy. With --sysroot nothing is opened on that device: its providers are "expected, not
    opened here". Providers the target does not list come last.

    \b
    Examples:
      edge-agent providers
      edge-agent providers --verify          # also open a real session on each available one
      edge-agent providers --json | jq '.[] | select(.available) | .name'
      edge-agent providers --sysroot intel-nuc-meteorlake
      edge-agent providers --target raspberry-pi-5
    """
    if verify and sysroot:
        raise ConfigError("--verify opens sessions on this host, so it cannot be combined with --sysroot")
    from agent.cli.profile import detect_profile
    from agent.providers import opened
    from agent.providers.ranking import rank

    profile = detect_profile(sysroot)
    target = _target(profile, target_name)
    results = rank(profile, target)
    results = opened.expected(results, f"capture {sysroot}") if sysroot else opened.confirm(results, profile, _cache())
    checks = _verify(results) if verify else {}
    if as_json:
        rows = [r.to_dict() for r in results]
        for row in rows:
            if row["name"] in checks:
                row["verified"] = checks[row["name"]]
        click.echo(json.dumps(rows, indent=2))
        return
    _print_table(results, getattr(target, "name", None), sysroot, checks)


def _verify(results) -> dict[str, dict]:
    """Smoke-test every available provider on a generated model (y = x + 1)."""
    import tempfile

    import numpy as np
    import onnx

    from agent.providers.ranking import smoke_test
    from agent.samples import tiny_model

    checks = {}
    with tempfile.TemporaryDirectory(prefix="edge-agent-verify-") as tmp:
        path = f"{tmp}/tiny.onnx"
        onnx.save(tiny_model(bias=1.0), path)
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        for r in results:
            if r.available:
                click.echo(f"verifying {r.name} ...", err=True)
                checks[r.name] = smoke_test(r, path, {"x": x}, {"y": x + 1.0})
    return checks


def _print_table(results, target_name: str | None, sysroot: str | None, checks: dict[str, dict]) -> None:
    where = f"capture {sysroot}" if sysroot else "this host"
    click.echo(f"target: {target_name or 'none matched'} (hardware from {where}; runtimes from this host)")
    from agent.cli.table import render_table

    rows = []
    for i, r in enumerate(results, 1):
        status = "available" if r.available else ("expected, not opened here" if r.expected else "unavailable")
        rows.append((str(i), r.name, status, ",".join(r.devices) or "-", _versions(r.versions)))
    head, *lines = render_table(("#", "PROVIDER", "STATUS", "DEVICES", "VERSIONS"), rows).splitlines()
    pad = " " * (len(str(len(results))) + 2)
    click.echo(head)
    for i, (line, r) in enumerate(zip(lines, results)):
        if target_name and not r.preferred and (i == 0 or results[i - 1].preferred):
            click.echo(f"-- not in the {target_name} target's preference list --")
        click.echo(line)
        click.echo(f"{pad}{'why' if not r.available else 'ok'}: {r.reason}")
        if not r.available and r.remedy:
            click.echo(f"{pad}fix: {r.remedy}")
        if r.options:
            click.echo(f"{pad}options: {json.dumps(r.options, sort_keys=True)}")
        if r.name in checks:
            c = checks[r.name]
            cov = "unknown" if c.get("coverage") is None else f"{c['coverage']:.0%}"
            click.echo(
                f"{pad}session: "
                + (
                    f"ok on {c['device']}, precision {c['precision']}, compile {c['compile_ms']} ms, coverage {cov}"
                    if c["ok"]
                    else f"FAILED: {c['error']}"
                )
            )
