"""Robustness of the daemon's lifecycle: a worker never dies with its deployment in flight, stop() never hands
the state_dir over while a writer lives, the swap mode is chosen and journaled, the status lists the providers
available here, and the qualifier hook replaces the measurement without subclassing."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from hostruntime import ort_openvino_devices
from support.agent import make_agent
from support.daemon import deploy, drop, fast, infer, wait_for, write_config

from agent.config import load_config
from agent.errors import LifecycleError
from agent.lifecycle import control
from agent.lifecycle.fsck import check_state_dir


def _agent(tmp_path, **kw):
    return make_agent(tmp_path, **kw)


def test_a_journal_write_that_fails_fails_the_deployment_and_the_worker_goes_on(tmp_path, monkeypatch):
    """The incident: FileNotFoundError out of Journal.save killed the worker; the deployment sat in received."""
    import agent.lifecycle.journal as jmod

    real, hits = jmod.atomic_write_json, []

    def vanishing_temp(path, obj, *a, **k):
        if obj.get("state") == "downloading" and not hits:  # the accept transition, once
            hits.append(path)
            raise FileNotFoundError(2, "No such file or directory", f"{path}.tmp")
        return real(path, obj, *a, **k)

    monkeypatch.setattr(jmod, "atomic_write_json", vanishing_temp)
    a = _agent(tmp_path).start()
    try:
        dep = deploy(a, "1")
        assert hits, "the fault was never injected"
        assert dep.state.value == "failed", dep.reason
        assert dep.reason.startswith("received: internal error: FileNotFoundError")
        assert a.orchestrator.in_flight() == {}
        assert a.status()["deployments"]["tiny"]["result"] == "failed"
        assert deploy(a, "2").state.value == "committed"  # the model's worker still takes work
        assert infer(a.url) == ("2", [2.0] * 4)
        assert check_state_dir(a.state_dir) == []
    finally:
        a.stop()


def test_stop_keeps_the_state_dir_locked_while_a_left_behind_worker_runs(tmp_path):
    """A step that ignores cancellation (a long compile) outlives stop(): the lock stays held and the journal
    refuses its writes, so a successor cannot start recovery (and temp-file cleaning) under a live writer."""
    entered, release = threading.Event(), threading.Event()

    def stuck(dep, ctx, measure):
        entered.set()
        release.wait(120)
        return measure()

    a = _agent(tmp_path, qualifier=stuck).start()
    try:
        drop(a.state_dir, "1")
        assert entered.wait(120), "qualification never started"
        a.stop(drain_timeout=0.3)
        assert control.daemon_running(a.state_dir)
        with pytest.raises(LifecycleError, match="in use by another edge-agent"):
            _agent(tmp_path).start()
        assert not a.stopped(timeout=0.2)
    finally:
        release.set()
    assert a.stopped(timeout=120)
    assert not control.daemon_running(a.state_dir)
    dep = a.orchestrator.journal.all()[-1]
    assert dep.state.value == "qualifying"  # nothing was journaled after stop(): recovery decides
    b = _agent(tmp_path).start()
    try:
        wait_for(lambda: b.registry.models().get("tiny") == "1" and not b.orchestrator.in_flight(), 120, "resumed")
        assert b.orchestrator.journal.load(dep.id).state.value == "committed"
        assert check_state_dir(b.state_dir) == []
    finally:
        b.stop()


def test_the_swap_mode_is_chosen_by_the_target_rule_and_journaled(tmp_path):
    sc = replace(fast(), serving={"swap": "make-before-break", "swap_when_memory_short": "stop-then-start"})
    a = _agent(tmp_path, step_config=sc).start()
    try:
        dep = deploy(a, "1")
        assert dep.state.value == "committed", dep.reason
        swap = dep.data["swap"]
        assert swap["mode"] in ("make-before-break", "stop-then-start") and "MemAvailable" in swap["why"]
        assert "the model's measured peak" in swap["why"], swap  # qualification's peak, not the file's size
        assert (" < 2 x" in swap["why"]) == (swap["mode"] == "stop-then-start")
        if swap["mode"] == "make-before-break":  # built below serving priority (serving.build_nice, default 10)
            assert swap["build"] == "nice +10", swap
        assert a.status()["deployments"]["tiny"]["swap"] == swap["mode"]
        a.steps.config = replace(a.steps.config, swap="stop-then-start")  # forced by configuration beats the rule
        dep = deploy(a, "2")
        swap = dep.data["swap"]
        assert {k: swap[k] for k in ("mode", "why", "build")} == {
            "mode": "stop-then-start",
            "why": "stop-then-start (set by configuration)",
            "build": "serving priority (stop-then-start)",
        }
        assert swap["session_s"] >= 0 and swap["first_answer_s"] >= swap["session_s"], swap  # the swap's timings
        assert infer(a.url) == ("2", [2.0] * 4)
    finally:
        a.stop()


def test_choose_swap_falls_back_when_memory_is_short():
    from agent.serving.memory import choose_swap

    rule = {"swap": "make-before-break", "swap_when_memory_short": "stop-then-start"}
    assert choose_swap(rule, 300 << 20, 500 << 20)[0] == "stop-then-start"
    assert choose_swap(rule, 300 << 20, 700 << 20)[0] == "make-before-break"
    assert choose_swap(rule, 300 << 20, None)[0] == "make-before-break"
    assert choose_swap({"swap": "stop-then-start"}, 1, 1 << 40)[0] == "stop-then-start"


def test_status_lists_the_providers_available_here_in_target_order(tmp_path):
    from agent.providers import PROVIDER_NAMES
    from agent.targets import get_target

    a = _agent(tmp_path).start()
    try:
        doc = wait_for(lambda: (d := a.write_status())["providers_source"] == "probed" and d, 180, "probe")
        listed = [p.name for p in get_target("generic-x86_64").providers]
        order = listed + [n for n in PROVIDER_NAMES if n not in listed]  # the target's order, then the rest
        assert "cpu" in doc["providers"] and doc["models"] == {}  # available, not only what models use
        assert doc["providers"] == [p for p in order if p in doc["providers"]]
        extra = [p for p in doc["providers"] if p not in listed]  # ort-openvino on Intel hosts with its plugin
        assert ("ort-openvino" in extra) == bool(ort_openvino_devices()), doc["providers"]
    finally:
        a.stop()
    b = _agent(tmp_path / "given", known_providers=["openvino", "cpu"]).start()
    try:
        doc = b.write_status()
        assert doc["providers"] == ["openvino", "cpu"] and doc["providers_source"] == "given"
    finally:
        b.stop()


def test_the_qualifier_hook_wraps_the_real_measurement(tmp_path):
    seen = []

    def qualifier(dep, ctx, measure):
        decision = measure()
        seen.append((dep.version, decision["selected"]))
        return decision

    a = _agent(tmp_path, qualifier=qualifier).start()
    try:
        assert deploy(a, "1").state.value == "committed"
        assert seen == [("1", "cpu")]
        assert len(list((a.state_dir / "decisions").glob("*.json"))) == 1
    finally:
        a.stop()


def test_a_status_probe_holding_the_lock_briefly_does_not_fail_the_daemon_start(tmp_path):
    """`edge-agent status` tests the lock with a shared flock; a daemon starting at that instant waits it out."""
    import fcntl
    import os

    state = tmp_path / "state"
    state.mkdir()
    fd = os.open(state / "agent.lock", os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # what control.daemon_running() does for a moment
    timer = threading.Timer(0.2, os.close, args=(fd,))
    timer.start()
    try:
        lock = control.StateLock(state).acquire(grace_s=60)
    finally:
        timer.join(60)
    try:
        assert control.daemon_running(state) and control.holder_pid(state) == os.getpid()
    finally:
        lock.release()


def test_serving_config_sets_probation_build_priority_and_finite_sampling(tmp_path):
    from agent.lifecycle.steps import StepConfig

    serving = {"host": "127.0.0.1", "port": 0, "probation_s": 0.5, "build_nice": 3, "finite_check_every": 2}
    cfg = load_config(write_config(tmp_path, extra={"serving": serving}))
    sc = StepConfig(providers=["cpu"], qualify_options=fast().qualify_options)  # the rest: from the file
    a = make_agent(None, config=cfg, step_config=sc, start=True)
    try:
        assert (a.step_config.probation_s, a.step_config.build_nice, a.registry.finite_every) == (0.5, 3, 2)
        dep = deploy(a, "1")
        assert dep.state.value == "committed", dep.reason
        if dep.data["swap"]["mode"] == "make-before-break":
            assert dep.data["swap"]["build"] == "nice +3"
        assert dep.data["probation"]["elapsed_s"] < 30  # the 0.5 s window, not the 60 s default
    finally:
        a.stop()
