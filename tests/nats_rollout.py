"""One rollout to a simulated fleet through a given broker (or cluster), optionally killing a broker node when the
second wave starts: shared by tests/test_nats_cluster.py and bench/bench_nats_converge.py."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import sysroots as captures
from agent.artifacts.keys import generate
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.fleet.rollout_plan import RolloutSpec
from agent.fleet.rollout_run import run_rollout
from agent.samples import tiny_model, write_package
from agent.sim.simulator import Simulator
from agent.transport.mqtt import BrokerConfig

CLASSES = ["amd-epyc-x86", "rpi5-8gb"]


def rollout_once(url: str, tmp: Path, devices: int, kill: Callable[[], None] | None = None) -> dict[str, Any]:
    """Start `devices` simulated devices on `url` (comma-separated nodes fail over), roll model m 2 out to them
    (canary 1, waves of 25 %), call `kill` when wave 1 starts. Returns the rollout summary, each device's own view
    of model m, when the kill happened, and the measured start-up and start-to-converge seconds."""
    key, pub, _ = generate(tmp / "keys")
    cfg = BrokerConfig(url)
    store = tmp / "store"
    server = ArtifactServer(ContentStore(store), cfg).start()
    sim = Simulator(
        devices,
        broker=cfg,
        trust=[str(pub)],
        groups=["fleet"],
        id_prefix="nc",
        sysroots=[str(captures.root() / c) for c in CLASSES],
        state_dir=str(tmp / "sim"),
        store=store,
        probation_s=1.0,
    )
    killed: dict[str, Any] = {}

    def progress(event: str, **f: Any) -> None:
        if os.environ.get("EDGE_NATS_DEBUG"):
            print(f"{time.monotonic():.1f} {event} {f}", flush=True)
        if event == "wave_started" and f.get("wave", 0) >= 1 and not killed and kill is not None:
            killed.update(wave=f["wave"], cohort=f.get("cohort"), at=time.monotonic())
            kill()

    try:
        t0 = time.monotonic()
        sim.start()
        sim.wait_ready(timeout=max(120.0, devices * 1.5))
        startup_s = time.monotonic() - t0
        pkg = write_package(tmp / "pkg", tiny_model(2.0), name="m", version="2")
        spec = RolloutSpec("m", "2", group="fleet", canary="1", wave_size="25%", deadline_s=900).validate()
        t0 = time.monotonic()
        summary = run_rollout(
            pkg, spec, key_file=key, store=store, broker=cfg, wait=True, tick_s=0.5, progress=progress
        )
        converge_s = time.monotonic() - t0
        models = {dev: agent.status()["models"].get("m") or {} for dev, agent in sim.agents.items()}
        if killed:
            killed["after_s"] = round(killed.pop("at") - t0, 2)
        return {
            "summary": summary,
            "models": models,
            "killed": killed,
            "startup_s": round(startup_s, 2),
            "converge_s": round(converge_s, 2),
        }
    finally:
        sim.stop()
        server.stop()
