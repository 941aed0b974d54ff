"""`edge-agent fleet`: control plane (push, serve, status here; rollout/rollback in fleet_rollout, simulate in
fleet_simulate)."""

from __future__ import annotations

import json
import threading

import click

from agent.cli import LazyGroup
from agent.cli.broker_opts import broker_config, broker_options
from agent.cli.fleet_cp import control_plane_options, cp_push, cp_register, cp_status
from agent.cli.table import render_table
from agent.cli.waitopt import wait_option
from agent.errors import ConfigError

FLEET_COMMANDS = {
    "push": ("agent.cli.fleet:push", "Store a package and publish its signed desired state."),
    "serve": ("agent.cli.fleet:serve", "Answer artifact chunk requests (safe to run several)."),
    "status": ("agent.cli.fleet:status", "One row per device from retained status topics."),
    "rollout": ("agent.cli.fleet_rollout:rollout", "Cohort-aware canary rollout with automatic halt."),
    "rollback": ("agent.cli.fleet_rollout:rollback", "Publish signed rollbacks to the previous version."),
    "simulate": ("agent.cli.fleet_simulate:simulate", "Run simulated devices from captured sysroots."),
    "register": ("agent.cli.fleet:register", "Register a device's public key and groups in the device registry."),
    "delete": ("agent.cli.fleet_cp:delete", "Delete a device and its documents from the control-plane service."),
    "unjudged": ("agent.cli.fleet_unjudged:unjudged", "A service rollout's devices not judged: accept or roll back."),
    "clear": ("agent.cli.fleet:clear", "Remove a retained desired state (a push to the wrong prefix or target)."),
    "attestations": ("agent.cli.attestations:fleet_attestations", "List and verify devices' signed attestations."),
}


@click.group(cls=LazyGroup, lazy=FLEET_COMMANDS)
@click.option(
    "--context",
    "context_name",
    metavar="NAME",
    help="Take --broker, --prefix, --store, --key from this context of ~/.config/edge-agent/fleet.yaml "
    "(default: its `current`); flags given on the command line win.",
)
@click.pass_context
def fleet(ctx, context_name):
    """Control plane: push models, serve artifacts, watch the fleet, roll out.

    \b
    Examples:
      edge-agent fleet --context lab status
      edge-agent fleet --context lab push pkg/ --name sample-tiny --version 3 --group quickstart --wait 600   (broker, store, key from the context)
    """
    from agent.cli.fleet_context import default_map, load_context

    _, values = load_context(context_name)
    if values:
        ctx.default_map = default_map(values, FLEET_COMMANDS)


def _render_push(event: str, f: dict) -> str | None:
    if event == "store":
        return f"push: storing {f['package']}"
    if event == "published":
        return f"push: published version {f['version']} to {', '.join(f['topics'])}"
    if event == "device":
        reason = f" ({f['reason']})" if f.get("reason") else ""
        return f"push: {f['device_id']}: {f['result']}{reason}"
    return None


def _load_overrides(path):
    if not path:
        return None
    from agent.util.yamlsafe import load_file

    doc = load_file(path, "--qualification", ConfigError)
    if not isinstance(doc, dict):
        raise ConfigError(f"--qualification: {path} must hold a mapping")
    return doc


@click.command()
@click.argument("package", type=click.Path(exists=True))
@click.option("--name", required=True, help="Model name (A-Z a-z 0-9 . _ -).")
@click.option("--version", "version", required=True, help="Dotted integers, newer than what devices run.")
@click.option("--device", "devices", multiple=True, metavar="ID", help="Target device (repeatable).")
@click.option("--group", "groups", multiple=True, metavar="G", help="Target group (repeatable).")
@click.option("--key", "key_file", type=click.Path(dir_okay=False), help="Fleet signing key (fleet.key; required).")
@click.option("--store", type=click.Path(file_okay=False), help="Control-plane content store (required).")
@broker_options
@control_plane_options
@wait_option("every targeted device to run this version (only reports signed by devices in STORE/registry.json count)")
@click.option("--http-url", metavar="URL", help="Also offer an http(s) source; '{sha256}' is replaced.")
@click.option("--chunk-size", type=int, default=256 * 1024, show_default=True, help="Bytes per MQTT chunk.")
@click.option("--ttl", "ttl_s", type=int, default=30 * 86400, show_default=True, help="Manifest lifetime in seconds.")
@click.option("--rollback", is_flag=True, help="Sign as a rollback (allows an older version).")
@click.option("--no-delta", is_flag=True, help="Leave out the chunk recipe (devices older than delta pulls refuse it).")
@click.option(
    "--qualification",
    "qualification_file",
    type=click.Path(dir_okay=False, exists=True),
    help="YAML/JSON file of qualification overrides carried in the manifest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def push(
    package,
    name,
    version,
    devices,
    groups,
    key_file,
    store,
    wait,
    http_url,
    chunk_size,
    ttl_s,
    rollback,
    no_delta,
    qualification_file,
    as_json,
    control_plane=None,
    cp_token_file=None,
    **kw,
):
    """Store PACKAGE (.onnx, directory or .tar.gz) and publish its signed, retained desired state."""
    from agent.cli.progress import Progress
    from agent.fleet.push import push as do_push
    from agent.fleet.pushspec import PushSpec

    if control_plane:  # the service stores, signs and publishes
        body = {"model": name, "version": version, "devices": list(devices), "groups": list(groups)}
        with Progress("push", _render_push, as_json) as progress:
            return cp_push(control_plane, cp_token_file, package, body, wait, as_json, progress)
    if not key_file or not store:
        raise click.UsageError("missing option '--key' or '--store' (or pass --control-plane URL)")
    spec = PushSpec(
        name=name,
        version=version,
        key_file=key_file,
        store=store,
        broker=broker_config(kw),
        prefix=kw["prefix"],
        devices=devices,
        groups=groups,
        http_url=http_url,
        chunk_size=chunk_size,
        ttl_s=ttl_s,
        rollback=rollback,
        qualification=_load_overrides(qualification_file),
        wait=wait,
        delta=not no_delta,
    )
    with Progress("push", _render_push, as_json) as progress:
        doc = do_push(package, spec, progress)
    _report_push(doc, name, version, as_json)


def _report_push(doc: dict, name: str, version: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        click.echo(f"pushed {name} {version} ({doc['sha256'][:16]}, {doc['size']} bytes, key {doc['key_id']})")
        for dev, r in sorted((doc.get("devices") or {}).items()):
            click.echo(f"  {dev}: {r['result']}" + (f" - {r['reason']}" if r.get("reason") else ""))
    if not doc["ok"]:
        bad = [
            f"{d}: {r['result']} ({r['reason']})"
            for d, r in sorted(doc["devices"].items())
            if r["result"] != "committed"
        ]
        raise click.exceptions.Exit(1) if as_json else _fail("; ".join(bad))


def _fail(message: str):
    from agent.errors import EdgeAgentError

    return EdgeAgentError(f"not every device runs the new version: {message}")


@click.command()
@click.option("--store", required=True, type=click.Path(file_okay=False), help="Content store to serve from.")
@broker_options
@click.option("--workers", type=int, default=2, show_default=True, help="Threads answering requests.")
@click.option("--http", "http_bind", metavar="HOST:PORT", help="Also serve blobs over HTTP with Range support.")
def serve(store, workers, http_bind, **kw):
    """Answer chunk requests from devices until interrupted (safe to run several)."""
    from agent.artifacts.store import ContentStore
    from agent.fleet.artifact_server import ArtifactServer, serve_http

    server = ArtifactServer(ContentStore(store), broker_config(kw), kw["prefix"], workers=workers).start()
    httpd = serve_http(ContentStore(store), http_bind) if http_bind else None
    mode = "shared subscription (MQTT 5)" if server.shared else "every server answers (MQTT 3.1.1)"
    click.echo(f"serving {store} on {server.link.broker.redacted()}: {mode}", err=True)
    if httpd:
        click.echo(
            f"serving blobs on http://{httpd.server_address[0]}:{httpd.server_address[1]}/blobs/sha256/<sha256>",
            err=True,
        )
    stop = threading.Event()
    try:
        server.serve_forever(stop)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if httpd:
            httpd.shutdown()
    click.echo(f"served {server.stats['chunks']} chunks ({server.stats['bytes']} bytes)", err=True)


@click.command()
@broker_options
@click.option(
    "--store", type=click.Path(file_okay=False), help="Control-plane store whose registry.json verifies reports."
)
@click.option("--registry", "registry_file", type=click.Path(dir_okay=False), help="Device registry file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@control_plane_options
def status(as_json, store, registry_file, control_plane=None, cp_token_file=None, **kw):
    """One row per device: online, models (version, provider, state), last deployment result and reason;
    `trust` says whether the report is signed by the device's registered key."""
    if control_plane:
        shown = cp_status(control_plane, cp_token_file, as_json)
        if shown is not None:  # the service's rollouts in progress, as over the broker
            from agent.cli.fleet_rollout import render_rollouts

            lines = render_rollouts([r["progress"] for r in shown["rollouts"] if r.get("progress")])
            if lines:
                click.echo(lines)
        return
    from agent.fleet.registry import NO_REGISTRY, REMEDY, DeviceRegistry, registry_for_store
    from agent.fleet.watch import device_row, fleet_status
    from agent.lifecycle.status_doc import figures_brief

    registry = DeviceRegistry.load(registry_file) if registry_file else registry_for_store(store)
    doc = fleet_status(broker_config(kw), kw["prefix"], registry=registry)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    from agent.cli.fleet_rollout import render_rollouts

    rollouts = render_rollouts(doc.get("rollouts", []))
    if not doc["devices"]:
        click.echo("no device has published a status under this prefix")
        if rollouts:
            click.echo(rollouts)
        return
    table = []
    unverified = 0
    for r in doc["devices"]:
        shown, mark = r, ""
        if r.get("trust") != "verified":  # what the device says, shown as its claim: never counted
            unverified += 1
            shown, mark = device_row(r["device_id"], r.get("unverified_claims") or {}), "claims: "
        models = (
            ", ".join(
                f"{m} {v.get('version')} {v.get('provider') or '-'} {v.get('state') or ''}".strip()
                for m, v in sorted(shown["models"].items())
            )
            or "-"
        )
        last = shown["last_deployment"]
        dep = "-"
        if last:
            dep = f"{last.get('model')} {last.get('version')}: {last.get('result') or last.get('state')}"
            if last.get("reason"):
                dep += f" ({last['reason']})"
            if figures_brief(last):
                dep += f" [{figures_brief(last)}]"
        trust = "no registry" if r.get("trust") == NO_REGISTRY else str(r.get("trust"))
        models = mark + models if models != "-" else models
        dep = mark + dep if dep != "-" else dep
        table.append((r["device_id"], "yes" if r["online"] else "no", trust, models, dep))
    click.echo(render_table(("DEVICE", "ONLINE", "TRUST", "MODELS", "LAST DEPLOYMENT"), table))
    click.echo(f"{doc['online']}/{doc['count']} online")
    if unverified:
        click.echo(
            f"{unverified} report(s) not verified: 'claims:' is what the device says; push --wait and rollouts "
            "never count it"
        )
    if registry is None:
        where = f"none in {store}" if store else "pass --store STORE or --registry FILE"
        click.echo(f"no device registry ({where}), nothing verified: " + REMEDY.format(store=store or "STORE"))
    if rollouts:
        click.echo(rollouts)


@click.command()
@click.argument("device_id")
@click.option("--public-key", "public_key", type=click.Path(dir_okay=False, exists=True), help="device.pub")
@click.option("--group", "groups", multiple=True, metavar="G", help="Group the device belongs to (repeatable).")
@click.option("--store", type=click.Path(file_okay=False), help="Control-plane store (registry.json).")
@click.option(
    "--replace", is_flag=True, help="Move a key another device holds to DEVICE_ID (revokes that device's binding)."
)
@control_plane_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def register(device_id, public_key, groups, store, replace, as_json, control_plane=None, cp_token_file=None):
    """Add or replace DEVICE_ID in STORE/registry.json: its public key (from `edge-agent keys device`) and its
    groups. push --wait, rollout and status believe only reports signed by this key, and take groups from here.
    A key already registered to another device is refused unless --replace.

    With --control-plane URL: the operator's side of enrollment through the API: with --public-key the device
    is registered and accepted with its groups before it asks; without, the device that asked (pending) is
    accepted (with --group: given these groups)."""
    from pathlib import Path

    from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry
    from agent.util.textfile import read_text

    pem = read_text(public_key, "--public-key", ConfigError) if public_key else None
    if control_plane:
        if replace:
            raise click.UsageError("--replace is for STORE/registry.json; through the API decommission the holder")
        doc = cp_register(control_plane, cp_token_file, device_id, pem, list(groups))
        click.echo(
            json.dumps(doc, indent=2, sort_keys=True)
            if as_json
            else f"{device_id} {doc['state']} (key {doc['key_id']}, groups {doc['groups']}) on {control_plane}"
        )
        return
    if not pem or not store:
        raise click.UsageError("missing option '--public-key' or '--store' (or pass --control-plane URL)")
    path = Path(store) / REGISTRY_NAME
    with DeviceRegistry.edit(path) as reg:
        entry = reg.register(device_id, pem, groups, replace=replace)
    doc = {
        "device_id": device_id,
        "key_id": entry["key_id"],
        "groups": entry["groups"],
        "registry": str(path),
        "revoked": entry["revoked"],
    }
    revoked = f"; revoked the binding of {', '.join(entry['revoked'])}" if entry["revoked"] else ""
    click.echo(
        json.dumps(doc)
        if as_json
        else f"registered {device_id} (key {entry['key_id']}, groups {entry['groups']}) in {path}{revoked}"
    )


@click.command()
@click.argument("model")
@click.option(
    "--device", "devices", multiple=True, metavar="ID", help="Clear this device's desired state (repeatable)."
)
@click.option("--group", "groups", multiple=True, metavar="G", help="Clear this group's desired state (repeatable).")
@broker_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def clear(model, devices, groups, as_json, **kw):
    """Remove the retained desired state of MODEL for devices or groups (an empty retained message, as MQTT
    clears one): devices keep what they run; nothing new is offered to them there.

    \b
    Examples:
      edge-agent fleet clear sample-tiny --group quickstart --broker mqtt://broker:1883 --prefix old-prefix
    """
    from agent.fleet.clear import clear_desired

    if not devices and not groups:
        raise click.UsageError("give --device ID or --group G (repeatable)")
    doc = clear_desired(broker_config(kw), kw["prefix"], model, devices, groups)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    for topic in doc["cleared"]:
        click.echo(f"cleared {topic}")
