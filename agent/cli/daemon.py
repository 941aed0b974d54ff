"""`edge-agent run | status | rollback`: the device daemon and its local control.

Test/tuning knobs read by `run` (environment):
  EDGE_AGENT_PROBATION_S        probation window after a swap (overrides serving.probation_s, default 60)
  EDGE_AGENT_QUALIFY_PROVIDERS  comma list of providers to qualify (default: the target's order)
  EDGE_AGENT_QUALIFY_BUDGET_S   latency budget per qualification row (default 5)
  EDGE_AGENT_QUALIFY_ISOLATE    0: rows run inside the (already separate) qualification process
  EDGE_AGENT_TEST_CRASH_AT      test only: SIGKILL the daemon right after journaling this state
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import click

from agent.config import DEFAULT_PATH, load_config
from agent.errors import ConfigError

MALLOC_ARENAS = 2
CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=str(DEFAULT_PATH),
    show_default=True,
    help="Agent configuration file.",
)


def render_event(record: dict) -> str:
    """One journald-friendly line per event: `event key=value ...`."""
    rec = dict(record)
    head = rec.pop("event", "event")
    rec.pop("device_id", None)
    parts = [head]
    for k, v in rec.items():
        if v is None or k == "ts":
            continue
        v = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)
        parts.append(f"{k}={json.dumps(v) if (' ' in v or not v) else v}")
    return " ".join(parts)


@click.command("run")
@CONFIG_OPTION
def run(config_path):
    """Run the device daemon: serve committed models, take new ones from MQTT or the local inbox.

    In local mode (no mqtt section) move a package directory atomically (rename) into
    INBOX/<name>/<version>/ and it goes through the lifecycle: downloading (into the store), verifying,
    qualifying, activating, probation, committed. SIGTERM/SIGINT drain and stop; SIGHUP reloads the
    serving token, trusted keys and telemetry interval (other changes are named as needing a restart).

    `edge-agent rollback NAME` reaches the running daemon through STATE_DIR/control/ (request files the
    daemon answers); `edge-agent status` reads STATE_DIR/status.json, rewritten on every transition.
    Operator guide: docs/daemon.md.
    """
    from agent.app import DeviceAgent
    from agent.cli.signals import SignalFlags
    from agent.sdnotify import SdNotifier
    from agent.serving.memory import MMAP_THRESHOLD, fix_mmap_threshold, limit_malloc_arenas

    cfg = load_config(config_path)
    for warning in cfg.warnings:
        click.echo(f"warning: {warning}", err=True)
    # before any thread exists: serving threads share 2 glibc arenas, so RSS stays flat across hot swaps
    arenas = limit_malloc_arenas(MALLOC_ARENAS)
    mmap_fixed = fix_mmap_threshold(MMAP_THRESHOLD)  # large blocks (weights, buffers) go back to the OS on release
    lock = threading.Lock()

    def log(record: dict) -> None:
        with lock:
            click.echo(render_event(record), err=True)

    from agent import settings

    agent = DeviceAgent(cfg, step_config=settings.from_env(), on_event=log, notifier=SdNotifier.from_env())
    # Signal handlers only set flags (SignalFlags: no lock); this loop acts on them (a reload takes locks, does I/O)
    flags = SignalFlags(stop=(signal.SIGTERM, signal.SIGINT), reload=(signal.SIGHUP,))
    agent.start()
    log(
        {
            "event": "memory",
            "malloc_arenas": MALLOC_ARENAS if arenas else "unchanged (no glibc mallopt)",
            "mmap_threshold": MMAP_THRESHOLD if mmap_fixed else "unchanged (no glibc mallopt)",
            "memory_max": agent.step_config.memory_max,  # serving.memory_max, resolved
            "request_budget": agent.server.budget.limit if agent.server is not None else None,
        }
    )
    try:
        while not flags.raised("stop"):
            flags.wait(1.0)
            if flags.take("reload") and not flags.raised("stop"):
                _reload(agent, config_path, log)
    finally:
        log({"event": "stopping"})
        agent.stop()
        log({"event": "stopped"})


def _reload(agent, config_path, log) -> None:
    try:
        result = agent.reload(load_config(config_path))
        log(
            {
                "event": "reloaded",
                "applied": ",".join(result["applied"]) or "nothing changed",
                "needs_restart": ",".join(result["needs_restart"]) or None,
            }
        )
    except ConfigError as exc:
        log({"event": "error", "reason": f"reload failed, keeping the running config: {exc}"})


@click.command("status")
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON.")
def status(config_path, as_json):
    """Show models (version, sha256, provider, state) and recent deployments of this device."""
    from agent.lifecycle.control import daemon_running, holder_pid
    from agent.lifecycle.fsck import check_state_dir
    from agent.lifecycle.status_doc import build_status, status_path
    from agent.util.atomic import read_json

    cfg = load_config(config_path, check_files=False)
    running = daemon_running(cfg.state_dir)
    saved = read_json(status_path(cfg.state_dir), default=None) if cfg.state_dir.is_dir() else None
    if running and saved:
        doc = saved
    else:
        known = saved or {}
        doc = (
            build_status(
                cfg.state_dir,
                device_id=cfg.device_id,
                groups=cfg.groups,
                target=known.get("target"),
                hardware=known.get("hardware"),
                providers=known.get("providers"),
            )
            if cfg.state_dir.is_dir()
            else {"device_id": cfg.device_id, "models": {}, "deployments": {}, "recent_deployments": []}
        )
        doc["online"] = False
    doc["daemon"] = {"running": running, "pid": holder_pid(cfg.state_dir) if running else None}
    doc["problems"] = check_state_dir(cfg.state_dir, rehash=False) if cfg.state_dir.is_dir() else []
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return
    _print_status(doc)


def _print_status(doc: dict) -> None:
    from agent.cli.table import render_table
    from agent.lifecycle.status_doc import figures_brief

    d = doc["daemon"]
    url = (doc.get("serving") or {}).get("url")
    click.echo(
        f"device {doc.get('device_id')}  target {doc.get('target') or '?'}  daemon "
        + (f"running (pid {d['pid']})" + (f", serving {url}" if url else "") if d["running"] else "stopped")
    )
    models = doc.get("models") or {}
    if not models:
        click.echo("no models committed")
    else:
        rows = [
            (n, m.get("version"), m.get("state"), m.get("provider"), m.get("precision"), (m.get("sha256") or "")[:12])
            for n, m in sorted(models.items())
        ]
        click.echo(render_table(("MODEL", "VERSION", "STATE", "PROVIDER", "PRECISION", "SHA256"), rows))
        for n, m in sorted(models.items()):
            if m.get("reason"):
                click.echo(f"  {n}: {m['reason']}")
    flying = _in_flight_rows(doc)
    if flying:
        click.echo("in flight:")
        click.echo(render_table(("MODEL", "VERSION", "STATE"), flying))
    for problem in doc.get("problems") or []:
        click.echo(f"problem: {problem}")
    cp = doc.get("control_plane")
    if cp:
        error = f"; last error: {cp['last_error']}" if cp.get("last_error") and cp.get("retrying") else ""
        click.echo(
            f"control plane {cp['url']}: {cp.get('enrollment') or 'not enrolled'}, {cp['posted']} record(s) posted, "
            f"{cp['pending']} pending{error}"
        )
    recent = doc.get("recent_deployments") or []
    if recent:
        click.echo("recent deployments:")
        for r in recent:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.get("ts") or 0))
            reason = f"  {r['reason']}" if r.get("reason") else ""
            click.echo(f"  {when}  {r.get('model')} {r.get('version')}  {r.get('state')}{reason}")
            brief = figures_brief(r)
            if brief:
                click.echo(f"      {brief}")


def _in_flight_rows(doc: dict) -> list[tuple]:
    """In-flight deployments; one waiting for the device's single qualification slot says it is queued, and
    behind how many, instead of `qualifying`."""
    queue = doc.get("qualification_queue") or {}
    waiting = [str(label).split(" (")[0] for label in queue.get("waiting") or []]
    rows = []
    for name, state in sorted((doc.get("in_flight") or {}).items()):
        dep = (doc.get("deployments") or {}).get(name) or {}
        version = dep.get("version")
        label = f"{name} {version}"
        if state == "qualifying" and label in waiting:
            ahead = waiting.index(label) + (1 if queue.get("running") else 0)
            state = f"queued for qualification ({ahead} ahead)"
        rows.append((name, version, state))
    return rows


@click.command("rollback")
@click.argument("name")
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for the running daemon.")
def rollback(name, config_path, as_json, timeout):
    """Swap NAME back to its previous committed version (no download).

    With the daemon running, the request goes through STATE_DIR/control/ and takes effect in the running
    daemon (new session built and warmed, then swapped in); otherwise the slots are swapped on disk and the
    next start serves the previous version.
    """
    from agent.lifecycle import control
    from agent.names import check_name

    cfg = load_config(config_path, check_files=False)
    check_name(name, "model name", ConfigError)

    def offline() -> dict:
        return {
            **control.offline_rollback(cfg.state_dir, name),
            "applied": "on disk; the daemon serves it when it starts",
        }

    result = _control_op(cfg.state_dir, "rollback", name, timeout, offline, as_json)
    if result is None:
        return
    dep = result.get("deployment") or {}
    if result.get("applied"):
        click.echo(f"{name}: rolled back to version {dep.get('version')}; {result['applied']}")
    elif dep.get("state") == "rolled_back":
        click.echo(
            f"{name}: version {dep.get('version')} was in {dep.get('reason') or 'probation'}; aborted, "
            f"serving version {result.get('serving')}"
        )
    else:
        click.echo(f"{name}: rolled back; serving version {result.get('serving')}")


@click.command("cancel")
@click.argument("target", metavar="NAME|DEPLOYMENT_ID")
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the running daemon.")
def cancel(target, config_path, as_json, timeout):
    """Cancel the in-flight deployment of a model (or one deployment by id), in any state.

    Before the swap it ends failed and the serving version stays; after it (probation) the previous version is
    swapped back. With the daemon stopped, the journal records the cancel and the next start resumes nothing.
    """
    from agent.lifecycle import control

    cfg = load_config(config_path, check_files=False)
    result = _control_op(
        cfg.state_dir, "cancel", target, timeout, lambda: control.offline_cancel(cfg.state_dir, target), as_json
    )
    if result is None:
        return
    dep = result.get("deployment") or {}
    click.echo(
        f"{result.get('model', target)}: deployment {dep.get('id')} (version {dep.get('version')}) cancelled in state "
        f"{dep.get('state')}"
    )


def _control_op(state_dir, op: str, target: str, timeout: float, offline, as_json: bool) -> dict | None:
    """Run a control op in the running daemon (control directory) or, with none running, offline(). With
    --json the result is printed (exit 1 unless ok) and None returned; otherwise a failure raises."""
    from agent.errors import LifecycleError
    from agent.lifecycle import control

    if control.daemon_running(state_dir):
        result = control.request(state_dir, op, timeout=timeout, model=target)
    else:
        result = offline()
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        if not result.get("ok"):
            sys.exit(1)
        return None
    if not result.get("ok"):
        raise LifecycleError(f"{op} of {target} failed: {result.get('error')}")
    return result
