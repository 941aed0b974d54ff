"""`edge-agent fleet simulate`: real device agents from captured sysroots in this process, until interrupted."""

from __future__ import annotations

import json

import click

from agent.cli.broker_opts import broker_config as _broker
from agent.cli.broker_opts import broker_options
from agent.cli.fleet_simulate_cp import KEYS as CP_KEYS
from agent.cli.fleet_simulate_cp import CpJoin, simulate_cp_options

STOP_REPORT_S = 120.0  # stopping every device takes seconds; this long, and the threads' stacks are printed


def _ranged(flag: str, name: str, kind: click.ParamType, default: float, text: str):
    """An option that takes a number in `kind`'s range, its default and range shown in --help."""
    return click.option(flag, name, type=kind, default=default, show_default=True, help=text)


@click.command("simulate")
@click.option(
    "--devices",
    "count",
    type=click.IntRange(1, 100000),
    required=True,
    help="Number of simulated devices (at most 5000 real ones; --light: up to 100000).",
)
@click.option(
    "--trust",
    "trust_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Fleet public key the devices trust (fleet.pub).",
)
@click.option("--group", "groups", multiple=True, help="Group every device joins (repeatable; default: sim).")
@click.option(
    "--sysroots",
    help="Comma-separated captured sysroots: directories, or names of "
    "the shipped captures (agent/sysroots; default: every one).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="Where device state lives (default: a temp dir, removed on exit).",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False),
    help="Control-plane store: the devices' keys and groups are registered in its registry.json, so "
    "`fleet push --wait` and `fleet rollout --store STORE` believe them.",
)
@click.option("--id-prefix", default="sim", show_default=True, help="Device ids are PREFIX-<class>-<n>.")
@_ranged(
    "--probation",
    "probation_s",
    click.FloatRange(0, 3600),
    2.0,
    "Seconds of probation after each swap before a device commits.",
)
@_ranged(
    "--latency-budget",
    "latency_budget_s",
    click.FloatRange(0.05, 60),
    0.3,
    "Seconds of timed runs per provider during qualification.",
)
@click.option("--no-shared-qualification", is_flag=True, help="Make every device measure for itself.")
@click.option("--http", "serve_http", is_flag=True, help="Give every device its inference API on a free loopback port.")
@_ranged(
    "--telemetry-interval",
    "telemetry_s",
    click.FloatRange(0, 86400),
    0.0,
    "Seconds between the health messages each device publishes (0: none).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the fleet layout and final stats as JSON lines.")
@click.option(
    "--agent-release",
    metavar="VERSION",
    help="Lay out each device's release root with VERSION current: the devices take `kind: agent` rollouts "
    "(docs/self-update.md: what is simulated).",
)
@click.option(
    "--release-fail",
    multiple=True,
    metavar="CLASS[:K]",
    help="With --agent-release: the devices of this class or target fail their release trials but for the "
    "first K of the class with CLASS:K, and but for a roll back to --agent-release (repeatable).",
)
@simulate_cp_options
@click.option(
    "--light",
    is_flag=True,
    help="Light devices: the device protocol (enrollment, signed statuses and decision records, desired state, "
    "chunk pulls with hash checks, probation, commit) without running models, thousands per process "
    "(docs/scaling.md); with --control-plane they enroll with --enroll-token-file's token.",
)
@_ranged("--clients", "clients", click.IntRange(1, 64), 4, "--light: MQTT connections the whole light fleet shares.")
@broker_options
def simulate(
    count,
    trust_file,
    groups,
    sysroots,
    state_dir,
    store,
    id_prefix,
    probation_s,
    latency_budget_s,
    no_shared_qualification,
    serve_http,
    telemetry_s,
    as_json,
    agent_release,
    release_fail,
    light,
    clients,
    **broker_kw,
):
    """Run N real device agents in this process (each its own MQTT client, state directory and hardware
    profile from a captured sysroot) until interrupted (Ctrl-C or SIGTERM). Qualification is real; identical
    devices share one measurement per (model sha256, target, provider set), and the output says so. With
    --control-plane URL every device enrolls with that service and posts its signed decision records and
    attestations there, as a daemon does; a line says how far the enrollment got whenever that changes."""
    import faulthandler
    import signal

    cp = CpJoin({k: broker_kw.pop(k) for k in CP_KEYS}, list(groups) or ["sim"])
    if (release_fail and not agent_release) or (agent_release and light):
        raise click.UsageError("--release-fail: only with --agent-release; --agent-release: not with --light")
    if light:
        from agent.cli.fleet_simulate_light import run_light

        light_kw = dict(control_plane=cp.url, enroll_token=cp.enroll_token, clients=clients, store=store)
        light_kw["prefix"] = broker_kw["prefix"]
        run_light(count, trust_file, groups, id_prefix, probation_s, as_json, _broker(broker_kw), **light_kw)
        return
    if count > 5000:
        raise click.UsageError("--devices: at most 5000 real devices (use --light for more)")

    from agent.cli.signals import SignalFlags
    from agent.sim.classes import resolve_sysroots
    from agent.sim.simulator import Simulator

    sim = Simulator(
        count,
        broker=_broker(broker_kw),
        prefix=broker_kw["prefix"],
        trust=[trust_file],
        groups=list(groups) or ["sim"],
        sysroots=resolve_sysroots(sysroots),
        state_dir=state_dir,
        id_prefix=id_prefix,
        probation_s=probation_s,
        latency_budget_s=latency_budget_s,
        share_qualification=not no_shared_qualification,
        serve_http=serve_http,
        store=store,
        control_plane=cp.url,
        enroll_token=cp.enroll_token,
        telemetry_s=telemetry_s,
        agent_release=agent_release,
        release_fail=tuple(release_fail),
    )
    if store is None and cp.url is None:
        click.echo(
            "simulate: no --store: the devices are not registered; push --wait and rollouts will not believe them",
            err=True,
        )
    flags = SignalFlags(stop=(signal.SIGTERM,))  # Ctrl-C stays KeyboardInterrupt
    try:
        sim.start(progress=_sim_progress)
        layout = sim.layout()
        click.echo(json.dumps({"event": "started", **layout}) if as_json else _render_layout(layout))
        while not flags.raised("stop"):
            cp.tick(sim.control_plane_states(), as_json)
            flags.wait(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        stats = sim.stats()
        # a stop that takes minutes says where it is stuck (every thread's stack on stderr), then goes on
        faulthandler.dump_traceback_later(STOP_REPORT_S, exit=False)
        sim.stop()
        faulthandler.cancel_dump_traceback_later()
        click.echo(
            json.dumps({"event": "stopped", **stats}) if as_json else f"simulate: stopped; {_render_stats(stats)}"
        )


def _render_stats(stats: dict) -> str:
    q = stats["qualification"]
    return (
        f"{stats['devices']} devices; qualifications measured {q['measured']}, reused {q['reused']} "
        f"(shared per model sha256, target and provider set); transitions {stats['transitions']}"
    )


def _sim_progress(event: str, **f) -> None:
    if event == "qualify_cache":
        click.echo(f"simulate: {f['device_id']}: reused qualification of {f['key']} measured on {f['first']}", err=True)
    elif event == "device_started":
        click.echo(f"simulate: {f['device_id']} up ({f['target']}; providers {', '.join(f['providers'])})", err=True)


def _render_layout(layout: dict) -> str:
    from agent.cli.table import render_table

    lines = [f"simulate: {layout['devices']} devices on {layout['broker']} (state {layout['state_dir']}); Ctrl-C stops"]
    if layout.get("control_plane"):
        lines.append(f"simulate: every device enrolls with {layout['control_plane']} and posts its records there")
    classes = []
    for cls, n in sorted(layout["classes"].items()):
        classes.append((cls, n, layout["targets"][cls], ", ".join(layout["providers"][cls])))
        for provider, why in sorted(layout["dropped"].get(cls, {}).items()):
            classes.append(("", "", "", f"not {provider}: {why}"))
    lines.append(render_table(("CLASS", "DEVICES", "TARGET", "PROVIDERS"), classes, indent="  ", right=(1,)))
    http = sorted(layout.get("http", {}).items())
    if http:
        lines.append(render_table(("DEVICE", "HTTP"), http, indent="  "))
    return "\n".join(lines)
