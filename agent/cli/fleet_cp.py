"""`fleet status` and `fleet rollout` with `--control-plane URL`: the same commands through the control plane's
API (the service holds the registry, signs, and runs the rollout) instead of the broker and a local store."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from agent.cli.table import render_table
from agent.errors import ConfigError


def control_plane_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--token-file",
        "cp_token_file",
        type=click.Path(dir_okay=False),
        help="File holding the operator token for --control-plane (default: $EDGE_AGENT_CP_TOKEN).",
    )(f)
    return click.option(
        "--control-plane",
        "control_plane",
        metavar="URL",
        help="Work through the control-plane service at URL (its API) instead of the broker and a store.",
    )(f)


def _token(path: str | None) -> str:
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--token-file: cannot read {path}: {exc}") from None
    token = os.environ.get("EDGE_AGENT_CP_TOKEN")
    if not token:
        raise ConfigError("--control-plane needs an operator token: --token-file FILE or $EDGE_AGENT_CP_TOKEN")
    return token


def cp_status(url: str, token_file: str | None, as_json: bool) -> dict[str, Any] | None:
    """Print the devices (and, with --json, the rollouts); returns the document when printed as a table, for
    the caller to add its rollout lines."""
    from agent.transport.cpclient import call

    token, rows, offset = _token(token_file), [], 0
    while True:
        page = call(url, "GET", f"/api/v1/devices?limit=1000&offset={offset}", token=token)
        rows += page["devices"]
        offset += len(page["devices"])
        if not page["devices"] or offset >= page["total"]:
            break
    doc: dict[str, Any] = {"devices": rows, "count": len(rows), "online": sum(1 for r in rows if r["online"])}
    doc["rollouts"] = call(url, "GET", "/api/v1/rollouts", token=token)["rollouts"]
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return None
    table = []
    for r in rows:
        models = (
            ", ".join(
                f"{m} {v.get('version')} {v.get('provider') or '-'} {v.get('state') or ''}".strip()
                for m, v in sorted(r["models"].items())
            )
            or "-"
        )
        table.append((r["device_id"], r["state"], "yes" if r["online"] else "no", r["target"], models))
    click.echo(render_table(("DEVICE", "STATE", "ONLINE", "TARGET", "MODELS"), table))
    click.echo(f"{doc['online']}/{doc['count']} online (verified reports only, from {url})")
    return doc


def _upload(url: str, token: str, package: str, name: str, version: str) -> None:
    from agent.artifacts.packtar import write_targz
    from agent.transport.cpclient import put_bytes

    src = Path(package)
    with tempfile.TemporaryDirectory() as tmp:
        if src.is_dir():
            out = Path(tmp) / "package.tar.gz"
            write_targz(src, out)
            src = out
        put_bytes(url, f"/api/v1/models/{name}/versions/{version}", src, token)


def cp_push(
    url: str,
    token_file: str | None,
    package: str,
    body: dict[str, Any],
    wait: float | None,
    as_json: bool,
    progress: Callable[..., None] = lambda event, **f: None,
) -> None:
    """Upload, then POST /push; with `wait`, poll the devices' verified status until each runs the version,
    saying each device's version as it changes (`progress`, the same events as a push over the broker)."""
    from agent.transport.cpclient import call

    token = _token(token_file)
    progress("store", package=str(package))
    _upload(url, token, package, body["model"], body["version"])
    doc = call(url, "POST", "/api/v1/push", body, token=token)
    progress("published", topics=[url], version=body["version"])
    _wait_versions(url, token, body, wait, doc, progress)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        click.echo(
            f"pushed {body['model']} {body['version']} ({doc['sha256'][:16]}, {doc['size']} bytes, key {doc['key_id']}) through {url}"
        )
        for dev, r in sorted((doc.get("devices") or {}).items()):
            click.echo(f"  {dev}: {r['result']}" + (f" - {r['reason']}" if r.get("reason") else ""))
    if not doc["ok"]:
        raise click.exceptions.Exit(1)


def _wait_versions(
    url: str,
    token: str,
    body: dict[str, Any],
    wait: float | None,
    doc: dict[str, Any],
    progress: Callable[..., None] = lambda event, **f: None,
) -> None:
    """With `wait`, poll the targeted devices' verified status until each runs body's version (or time is up),
    saying each device's version as it changes; doc gains `devices` ({id: {result, reason}}) and `ok`."""
    from agent.fleet.outcome import COMMITTED, ON_PROBATION, model_phase, same_version

    if wait is None:
        doc["ok"] = True
        return
    deadline = time.monotonic() + wait
    said: dict[str, Any] = {}
    while True:
        have = {}  # device -> (result, reason): committed only once probation passed (agent.fleet.outcome)
        for d, r in _targeted(url, token, body).items():
            model = (r.get("models") or {}).get(body["model"])
            phase, words = model_phase(model)
            on_it = isinstance(model, dict) and same_version(model.get("version"), body["version"])
            have[d] = (phase if on_it else "pending", words.removeprefix(f"{ON_PROBATION}, "))
        for d, (result, words) in sorted(have.items()):
            seen = (result, "" if result == ON_PROBATION else words)  # the seconds left are no change
            if said.get(d) != seen:  # every change is said as it happens
                said[d] = seen
                progress("device", device_id=d, result=result, reason=words)
        if (have and all(r == COMMITTED for r, _ in have.values())) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    doc["devices"] = {
        d: {
            "result": r if r in (COMMITTED, ON_PROBATION) else "not confirmed",
            "reason": None if r == COMMITTED else w,
        }
        for d, (r, w) in have.items()
    }
    doc["ok"] = bool(have) and all(r == COMMITTED for r, _ in have.values())


def cp_register(url: str, token_file: str | None, device_id: str, pem: str | None, groups: list[str]) -> dict:
    """The operator's side of enrollment: with a public key, pre-register (accepted, with groups); without,
    accept the device that asked (pending), giving it `groups` when any are named."""
    from agent.transport.cpclient import call

    token = _token(token_file)
    if pem is not None:
        body = {"device_id": device_id, "public_key": pem, "groups": groups}
        return call(url, "POST", "/api/v1/devices", body, token=token)
    return call(url, "POST", f"/api/v1/devices/{device_id}/accept", {"groups": groups} if groups else None, token=token)


def cp_rollback(
    url: str,
    token_file: str | None,
    name: str,
    rollout_id: str | None,
    targets: dict[str, list[str]],
    version: str | None,
    wait: float | None,
) -> dict[str, Any]:
    """`fleet rollback --control-plane`: roll back a service rollout (halt, then signed rollbacks for every
    device that took the version), or push `version` as a signed rollback to devices or groups."""
    from agent.transport.cpclient import call

    token = _token(token_file)
    if rollout_id is not None:
        doc = call(url, "GET", f"/api/v1/rollouts/{rollout_id}", token=token)
        if doc["model"] != name:
            raise ConfigError(f"--rollout: {rollout_id} rolls out {doc['model']}, not {name}")
        doc = call(url, "POST", f"/api/v1/rollouts/{rollout_id}/rollback", token=token)
        deadline = time.monotonic() + (wait or 0.0)
        while wait is not None and doc["phase"] not in ("finished", "failed") and time.monotonic() < deadline:
            time.sleep(1.0)
            doc = call(url, "GET", f"/api/v1/rollouts/{rollout_id}", token=token)
        op = (doc.get("progress") or {}).get("rollback") or {}
        done = doc["phase"] == "finished" and op.get("state", "done") == "done"
        return {"rollout": doc, "rollback": op or None, "ok": wait is None or done}
    if version is not None:
        body = {"model": name, "version": version, **targets, "rollback": True}
        doc = call(url, "POST", "/api/v1/push", body, token=token)
        _wait_versions(url, token, body, wait, doc)
        return doc
    # no --version: each device back to the version it ran before the latest rollout of NAME that reached it
    # (the rule of `fleet rollback` over the broker; never a device's `previous`, which after a roll back is
    # the version rolled back from)
    before = _previous_from_rollouts(url, token, name)
    by_version: dict[str, list[str]] = {}
    for dev in _targeted(url, token, targets):
        if dev not in before:
            raise ConfigError(f"{dev}: no rollout of {name} through {url} says what it ran before: give --version V")
        by_version.setdefault(before[dev], []).append(dev)
    if not by_version:
        raise ConfigError(f"no accepted device matches {targets}: nothing to roll back")
    out: dict[str, Any] = {"model": name, "versions": {}, "devices": {}, "ok": True}
    for prev, devs in sorted(by_version.items()):
        body = {"model": name, "version": prev, "devices": sorted(devs), "groups": [], "rollback": True}
        doc = call(url, "POST", "/api/v1/push", body, token=token)
        _wait_versions(url, token, body, wait, doc)
        out["versions"][prev] = sorted(devs)
        out["devices"].update(doc.get("devices") or {})
        out["ok"] = out["ok"] and doc["ok"]
    return out


def _previous_from_rollouts(url: str, token: str, name: str) -> dict[str, str]:
    """{device: the version it ran before the latest rollout of `name` that reached it} from the service."""
    from agent.transport.cpclient import call

    rows = [r for r in call(url, "GET", "/api/v1/rollouts", token=token)["rollouts"] if r.get("model") == name]
    out: dict[str, str] = {}
    for r in sorted(rows, key=lambda r: r.get("created_at") or 0, reverse=True):
        doc = call(url, "GET", f"/api/v1/rollouts/{r['rollout_id']}", token=token)
        for d in (doc.get("progress") or {}).get("devices") or []:
            if d["device_id"] not in out and d["result"] != "pending" and d.get("previous_version"):
                out[d["device_id"]] = str(d["previous_version"])
    return out


def _targeted(url: str, token: str, targets: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The accepted devices of targets' groups and devices, by id, as the API lists them."""
    from agent.transport.cpclient import call

    rows: dict[str, dict[str, Any]] = {}
    for g in targets["groups"]:
        for d in call(url, "GET", f"/api/v1/devices?state=accepted&group={g}&limit=1000", token=token)["devices"]:
            rows[d["device_id"]] = d
    for dev in targets["devices"]:
        rows[dev] = call(url, "GET", f"/api/v1/devices/{dev}", token=token)
    return rows


def cp_rollout(
    url: str,
    token_file: str | None,
    package: str,
    body: dict[str, Any],
    wait: bool,
    as_json: bool,
    render: Callable[[dict], str],
) -> None:
    from agent.transport.cpclient import call

    token = _token(token_file)
    _upload(url, token, package, body["model"], body["version"])
    rid = call(url, "POST", "/api/v1/rollouts", body, token=token)["rollout_id"]
    click.echo(f"rollout {rid} started on {url}", err=True)
    while True:
        doc = call(url, "GET", f"/api/v1/rollouts/{rid}", token=token)
        if doc["phase"] in ("finished", "failed") or not wait:
            break
        time.sleep(1.0)
    if doc["phase"] == "failed":
        raise ConfigError(f"rollout {rid} could not start: {doc['reason']}")
    summary = doc.get("progress") or {"rollout_id": rid, "state": doc["phase"]}
    click.echo(json.dumps(summary, indent=2, sort_keys=True) if as_json or not doc.get("progress") else render(summary))
    if summary.get("state") in ("halted", "partial"):
        sys.exit(1)


@click.command("delete")
@click.argument("device_id")
@control_plane_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def delete(device_id: str, control_plane: str | None, cp_token_file: str | None, as_json: bool) -> None:
    """Delete DEVICE_ID from the control-plane service (DELETE /api/v1/devices/ID, an admin token): its row, its
    groups, its decision records and conformance reports; audited. A device that asks again is a new pending one."""
    from urllib.parse import quote

    from agent.transport.cpclient import call

    if not control_plane:
        raise click.UsageError("missing option '--control-plane URL' (the service to delete the device from)")
    doc = call(control_plane, "DELETE", f"/api/v1/devices/{quote(device_id, safe='')}", token=_token(cp_token_file))
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    rows = ", ".join(f"{n} {table}" for table, n in sorted(doc["deleted"].items()))
    click.echo(f"deleted {device_id} from {control_plane} ({rows} row(s))")
