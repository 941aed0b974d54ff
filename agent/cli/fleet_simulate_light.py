"""`edge-agent fleet simulate --light`: the light fleet (agent.sim.light) until interrupted, its counts printed."""

from __future__ import annotations

import json

import click


def run_light(count, trust_file, groups, id_prefix, probation_s, as_json, broker, **kw) -> None:
    import signal

    from agent.cli.signals import SignalFlags
    from agent.sim.light import LightFleet, LightOptions

    opts = LightOptions(
        groups=list(groups) or ["sim"],
        id_prefix=id_prefix if id_prefix != "sim" else "light",
        probation_s=probation_s,
        **kw,
    )
    fleet = LightFleet(count, broker, [trust_file], opts)
    if not kw.get("control_plane") and not kw.get("store"):
        click.echo("simulate --light: no --control-plane or --store: nothing will believe these devices", err=True)
    flags = SignalFlags(stop=(signal.SIGTERM,))
    try:
        fleet.start(progress=_progress)
        started = {"event": "started", "light": True, **fleet.stats()}
        click.echo(json.dumps(started) if as_json else f"simulate --light: {count} devices; Ctrl-C stops")
        while not flags.raised("stop"):
            flags.wait(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()
        stats = fleet.stats()
        click.echo(json.dumps({"event": "stopped", **stats}) if as_json else f"simulate --light: stopped; {stats}")


def _progress(event: str, **f) -> None:
    if event == "light_error":
        click.echo(f"simulate --light: {f['device_id']}: {f['error']}", err=True)
    elif event == "light_enrolled":
        click.echo(f"simulate --light: enrolled {f}", err=True)
