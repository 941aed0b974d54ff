"""`edge-agent fleet rollout | rollback`: cohort-aware canary rollouts, signed rollbacks, and the `fleet status`
lines of rollouts in progress (`fleet simulate` is in fleet_simulate)."""

from __future__ import annotations

import json
import sys
import threading

import click

from agent.cli.broker_opts import broker_config as _broker
from agent.cli.broker_opts import broker_options
from agent.cli.fleet_cp import control_plane_options, cp_rollback, cp_rollout
from agent.cli.table import duration, render_table
from agent.cli.waitopt import wait_option


def _render_progress(event: str, f: dict) -> str | None:
    if event == "wave_started":
        return f"rollout: cohort {f['cohort']}: {f['kind']} {f['wave']} started on {f['devices']} device(s)"
    if event == "device":
        reason = f" ({f['reason']})" if f.get("reason") else ""
        return f"rollout: {f['device_id']}: {f['result']}{reason}"
    if event == "cohort_halted":
        return f"rollout: cohort {f['cohort']} HALTED: {f['reason']}; rolling back what it touched"
    if event == "cohort_completed":
        return f"rollout: cohort {f['cohort']} completed"
    if event == "rollout_finished":
        return f"rollout: {f['rollout_id']} {f['state']}: {f['counts']}"
    if event == "resumed":
        return f"rollout: resuming {f['rollout_id']} from {f['path']}"
    if event == "warning":
        return f"rollout: warning: {f['message']}"
    return None


def render_summary(doc: dict) -> str:
    lines = [
        f"rollout {doc['rollout_id']}: {doc['model']} -> {doc['version']}  state: {doc['state']}  "
        f"counts: {json.dumps(doc['counts'], sort_keys=True)}"
    ]
    cohorts = [
        (
            key,
            c["state"],
            ", ".join(f"{w['kind']} {w['counts'].get('succeeded', 0)}/{w['size']}" for w in c["waves"]),
            c.get("reason"),
        )
        for key, c in doc["cohorts"].items()
    ]
    lines.append(render_table(("COHORT", "STATE", "SUCCEEDED PER WAVE", "REASON"), cohorts, indent="  "))
    rows = [(d["device_id"], d["cohort"], d["wave"], d["result"], d["reason"] or "") for d in doc["devices"]]
    lines.append(render_table(("DEVICE", "COHORT", "WAVE", "RESULT", "REASON"), rows, indent="  ", right=(2,)))
    return "\n".join(lines)


@click.command("rollout")
@click.argument("package", type=click.Path(exists=True))
@click.option("--name", required=True, help="Model name.")
@click.option("--version", "version", required=True, help="New version (dotted integers, higher than installed).")
@click.option("--group", help="Roll out to the members of this group (from the device registry, STORE/registry.json).")
@click.option("--all", "all_devices", is_flag=True, help="Roll out to every device in the device registry.")
@click.option(
    "--cohort-by",
    type=click.Choice(["target", "provider"]),
    help="Split devices into cohorts by hardware target or primary provider; each has its own canary.",
)
@click.option("--canary", default="1", show_default=True, metavar="N|P%", help="Canary size per cohort (0: none).")
@click.option(
    "--wave-size", default="25%", show_default=True, metavar="N|P%", help="Devices per wave after the canary."
)
@click.option(
    "--max-failures",
    default="0%",
    show_default=True,
    metavar="P%",
    help="Halt (the cohort) and roll back once failures pass this share of the devices attempted.",
)
@click.option(
    "--deadline",
    type=click.FloatRange(1, 7 * 86400),
    default=600.0,
    show_default=True,
    help="Seconds a wave may take; devices silent past it count as failed.",
)
@click.option("--key", "key_file", type=click.Path(dir_okay=False), help="Ed25519 signing key (fleet.key; required).")
@click.option(
    "--store", type=click.Path(file_okay=False), help="Control-plane artifact store and rollout state (required)."
)
@click.option(
    "--http-url",
    metavar="URL",
    help="Also offer the artifact over HTTP(S) at URL (e.g. a CDN); {sha256} is substituted.",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(1024, 8 * 1024 * 1024),
    default=256 * 1024,
    show_default=True,
    help="Bytes per chunk (and per chunk hash in the manifest).",
)
@click.option(
    "--http-only", is_flag=True, help="Offer the artifact only at --http-url (keeps artifact bytes off the broker)."
)
@click.option(
    "--halt-on-unjudged",
    is_flag=True,
    help="Count devices whose probation could not judge the version (not judged) as failures; "
    "by default they are counted apart.",
)
@wait_option("the rollout to end (driving it); without --wait it is advanced once; run again to resume")
@click.option("--json", "as_json", is_flag=True, help="Print the summary JSON.")
@broker_options
@control_plane_options
def rollout(
    package,
    name,
    version,
    group,
    all_devices,
    cohort_by,
    canary,
    wave_size,
    max_failures,
    deadline,
    key_file,
    store,
    chunk_size,
    http_url,
    http_only,
    halt_on_unjudged,
    wait,
    as_json,
    control_plane=None,
    cp_token_file=None,
    **broker_kw,
):
    """Roll PACKAGE out as NAME VERSION: canary first (per cohort), then waves that must each pass before the
    next; a cohort whose failures pass --max-failures halts and every device that took the version is rolled
    back with signed rollback manifests. State lives in STORE/rollouts/: run the same command again to
    resume. Only reports signed by a device registered in STORE/registry.json (`edge-agent fleet register`)
    count; without a registry it refuses to start. Exits 0 when completed (or still running without --wait),
    1 when halted or partial."""
    from agent.cli.progress import Progress
    from agent.fleet.rollout_plan import RolloutSpec
    from agent.fleet.rollout_run import run_rollout
    from agent.fleet.rollout_state import ROLLOUT_FINAL

    if bool(group) == bool(all_devices):
        raise click.UsageError("give exactly one of --group G or --all")
    if control_plane:  # the service signs, holds the registry and runs the rollout
        body = {
            "model": name,
            "version": version,
            "group": group,
            "cohort_by": cohort_by,
            "canary": canary,
            "wave_size": wave_size,
            "max_failures": max_failures,
            "deadline_s": deadline,
        }
        return cp_rollout(control_plane, cp_token_file, package, body, wait, as_json, render_summary)
    if not key_file or not store:
        raise click.UsageError("missing option '--key' or '--store' (or pass --control-plane URL)")
    spec = RolloutSpec(
        name,
        version,
        group=group,
        cohort_by=cohort_by,
        canary=canary,
        wave_size=wave_size,
        max_failures=max_failures,
        deadline_s=deadline,
        halt_on_unjudged=halt_on_unjudged,
    ).validate()
    with Progress("rollout", _render_progress, as_json) as progress:
        summary = run_rollout(
            package,
            spec,
            key_file=key_file,
            store=store,
            broker=_broker(broker_kw),
            prefix=broker_kw["prefix"],
            http_url=http_url,
            http_only=http_only,
            wait=wait is not None,
            stop=_stop_after(wait),
            chunk_size=chunk_size,
            progress=progress,
        )
    click.echo(json.dumps(summary, indent=2, sort_keys=True) if as_json else render_summary(summary))
    if summary["state"] in ("halted", "partial"):
        sys.exit(1)
    if wait is not None and summary["state"] not in ROLLOUT_FINAL:
        click.echo(
            f"rollout: still {summary['state']} after --wait {duration(wait)}; run the same command to resume", err=True
        )
        sys.exit(1)


def _stop_after(seconds: float | None) -> threading.Event | None:
    """An event set after `seconds` (the rollout stops driving then; its state is kept for a resume)."""
    if seconds is None:
        return None
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    return stop


@click.command("rollback")
@click.argument("name")
@click.option("--device", "device_id", help="Roll back this device.")
@click.option("--group", help="Roll back every device of this group.")
@click.option(
    "--version",
    "version",
    help="Version to return to (default: each device's version before the latest rollout of NAME that reached "
    "it: the store's rollouts, or the service's with --control-plane).",
)
@click.option("--rollout", "rollout_id", help="With --control-plane: roll back this rollout of the service.")
@click.option("--key", "key_file", type=click.Path(dir_okay=False), help="Ed25519 signing key.")
@click.option("--store", type=click.Path(file_okay=False), help="Control-plane store (artifacts, rollouts).")
@wait_option("devices to confirm the rollback")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
@broker_options
@control_plane_options
def rollback(
    name,
    device_id,
    group,
    version,
    rollout_id,
    key_file,
    store,
    wait,
    as_json,
    control_plane=None,
    cp_token_file=None,
    **broker_kw,
):
    """Publish signed rollback manifests (rollback: true) returning NAME to its previous version on one
    device or a group. Exits 1 if any device could not be rolled back.

    With --control-plane URL (through the API): --rollout ID halts that rollout and rolls back every device
    that took or is taking its version, in every cohort and wave (run it again while any device still runs the
    version); --device/--group push each device's version before the latest rollout of NAME (or --version V,
    uploaded to the service) as a signed rollback."""
    from agent.fleet.rollout_run import run_rollback

    if control_plane:
        if bool(rollout_id) == bool(device_id or group) or (device_id and group):
            raise click.UsageError("with --control-plane give exactly one of --rollout ID, --device ID, --group G")
        targets = {"devices": [device_id] if device_id else [], "groups": [group] if group else []}
        doc = cp_rollback(control_plane, cp_token_file, name, rollout_id, targets, version, wait)
        if as_json:
            click.echo(json.dumps(doc, indent=2, sort_keys=True))
        else:
            _echo_cp_rollback(doc, rollout_id, version)
        if not doc["ok"]:
            sys.exit(1)
        return
    if rollout_id:
        raise click.UsageError("--rollout ID needs --control-plane URL")
    if bool(device_id) == bool(group):
        raise click.UsageError("give exactly one of --device ID or --group G")
    if not key_file or not store:
        raise click.UsageError("missing option '--key' or '--store' (or pass --control-plane URL)")
    result = run_rollback(
        name,
        device=device_id,
        group=group,
        version=version,
        key_file=key_file,
        store=store,
        broker=_broker(broker_kw),
        prefix=broker_kw["prefix"],
        wait_s=wait or 0.0,
    )
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        rows = [(d["device_id"], d["result"], d.get("version"), d["reason"]) for d in result["devices"]]
        click.echo(render_table(("DEVICE", "RESULT", "VERSION", "REASON"), rows))
    if any(d["result"] in ("failed", "skipped") for d in result["devices"]):
        sys.exit(1)


def render_rollouts(docs: list[dict], finished: bool = False) -> str:
    """`fleet status` lines for retained rollout progress documents: rollouts in progress with per-wave counts
    (wave index, kind, size, succeeded/failed/in progress); finished ones are counted (listed with finished=True)."""
    active = [d for d in docs if isinstance(d, dict) and d.get("state") == "running"]
    done = [d for d in docs if isinstance(d, dict) and d.get("state") != "running"]
    lines = []
    for d in active + (done if finished else []):
        lines.append(
            f"rollout {d.get('rollout_id')}: {d.get('model')} -> {d.get('version')} ({d.get('state')}; "
            f"{d.get('devices')} devices; {json.dumps(d.get('counts', {}), sort_keys=True)})"
        )
        for key, c in sorted((d.get("cohorts") or {}).items()):
            waves = []
            for w in c.get("waves", []):
                n = w.get("counts", {})
                busy = n.get("in_progress", 0) + n.get("rollback_pending", 0)
                unjudged = f"/{n['not_judged']} not judged" if n.get("not_judged") else ""
                waves.append(
                    f"{w.get('kind')} {w.get('index')}: {n.get('succeeded', 0)} ok/{n.get('failed', 0)} "
                    f"failed{unjudged}/{busy} busy of {w.get('size')}"
                )
            reason = f" - {c['reason']}" if c.get("reason") else ""
            reason += f" - {c['waiting']} (fleet unjudged {d.get('rollout_id')})" if c.get("waiting") else ""
            lines.append(f"  {key}: {c.get('state')}, wave {c.get('wave')}/{c.get('waves_total')}{reason}")
            lines += [f"    {w}" for w in waves]
    if done and not finished:
        lines.append(f"{len(done)} finished rollout(s) retained (see `fleet rollout ... --json` for their summaries)")
    return "\n".join(lines)


def _echo_cp_rollback(doc: dict, rollout_id: str | None, version: str | None) -> None:
    """What a control-plane rollback did: the rollout's roll back operation, or each device's result."""
    if rollout_id:
        r, op = doc["rollout"], doc.get("rollback") or {}
        click.echo(f"rollout {rollout_id}: {r['phase']}, {r['rollback_requested']} (state {r['state']})")
        if op:
            counts = ", ".join(f"{k} {v}" for k, v in sorted((op.get("result") or {}).items()))
            click.echo(f"roll back: {op['state']}" + (f" ({counts})" if counts else ""))
        if op.get("remaining"):
            click.echo(f"still on the version: {', '.join(op['remaining'])}: run this command again")
        return
    back = {d: v for v, devs in (doc.get("versions") or {}).items() for d in devs}  # without --version
    devices = sorted((doc.get("devices") or {}).items())
    rows = [(d, r["result"], version or back.get(d), r["reason"] or "") for d, r in devices]
    click.echo(
        render_table(("DEVICE", "RESULT", "VERSION", "REASON"), rows)
        if rows
        else f"pushed rollback to {version or ', '.join(sorted(doc.get('versions') or {}))}"
    )
