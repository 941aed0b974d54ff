"""Row workers forked from a server that imported the runtimes once (agent.isolate.forkserver): a crash is
still a row, the child's stderr and priority are as a spawned worker's; and on a daemon, ten packages dropped
at once never run more than one checker or row process at a time (the package check waits in the
qualification queue), sampled from the process tree while they deploy."""

from __future__ import annotations

import os
import threading

import psutil
from support.daemon import Daemon, drop, write_config
from test_daemon_qualify import _results

from agent.isolate.forkserver import KEPT_NAME, WORKER_NAME
from agent.isolate.runner import FAULT_ENV, IsolatedWorker


def test_a_forked_worker_is_a_child_of_the_preloaded_server_and_a_crash_is_a_result(monkeypatch):
    with IsolatedWorker(nice=3) as w:
        res = w.call("os:getpid", {}, timeout=60)
        assert res.ok
        proc = psutil.Process(res.value)
        assert proc.name() == WORKER_NAME and "forkserver" in " ".join(proc.parent().cmdline())  # forked
        assert proc.nice() == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)
    monkeypatch.setenv(FAULT_ENV, "abort:boom")  # a worker reads the fault hook as its caller had it at start
    with IsolatedWorker() as w:
        crashed = w.call("os:getpid", {}, timeout=60, tag="boom")
        assert not crashed.ok and crashed.kind == "crashed" and "SIGABRT" in crashed.error
        again = w.call("os:getpid", {}, timeout=60)  # the next call gets a fresh fork
        assert again.ok and w.restarts == 1


def test_spawned_workers_remain_available(monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_SPAWN_WORKERS", "1")
    with IsolatedWorker() as w:
        res = w.call("os:getpid", {}, timeout=120)
        assert res.ok and "agent.isolate.worker" in " ".join(psutil.Process(res.value).cmdline())


def _busy_workers(root: psutil.Process) -> list[int]:
    """Checker and row processes under the daemon: worker processes (forked ones are named edge-worker, or
    edge-kept while one idles with its row's session; spawned ones run agent.isolate.worker) with no worker
    below them (a qualification's child holds its rows)."""
    info = {}
    try:
        procs = root.children(recursive=True)
    except psutil.Error:
        return []
    for p in procs:
        try:
            named = p.name() in (WORKER_NAME, KEPT_NAME)  # a kept (idle) row worker counts as one too
            info[p.pid] = (p.ppid(), named or p.cmdline()[1:3] == ["-m", "agent.isolate.worker"])
        except psutil.Error:
            continue
    workers = {pid for pid, (_, is_worker) in info.items() if is_worker}
    above = set()
    for w in workers:
        pid = info[w][0]
        while pid in info:
            above.add(pid)
            pid = info[pid][0]
    return sorted(workers - above)


def _describe(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"{pid} {p.name()} {p.status()} parent {p.ppid()} {' '.join(p.cmdline())[-80:]}"
    except psutil.Error as exc:
        return f"{pid} gone ({exc})"


def test_ten_packages_dropped_at_once_run_one_checker_or_row_process_at_a_time(tmp_path):
    cfg = write_config(tmp_path)
    state = tmp_path / "state"
    d = Daemon(cfg, state, env={"EDGE_AGENT_QUALIFY_ISOLATE": "1"})
    names = [f"m{i}" for i in range(10)]
    peak, samples, stop = [0], [0], threading.Event()
    seen: list = []

    def sample() -> None:
        root = psutil.Process(d.proc.pid)
        while not stop.is_set():
            busy = _busy_workers(root)
            samples[0] += 1
            if len(busy) > peak[0]:
                seen.append([_describe(b) for b in busy])
            peak[0] = max(peak[0], len(busy))
            stop.wait(0.01)

    try:
        d.wait_ready()
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        for name in names:
            drop(state, "1", name=name)
        deps = _results(d, names)
        stop.set()
        t.join(10)
        assert all(deps[n]["result"] == "committed" for n in names), deps
        assert samples[0] > 50, samples  # the sampler saw the whole run
        assert peak[0] == 1, seen  # never two checkers, never a checker beside a row, never two rows
    finally:
        stop.set()
        assert d.terminate() == 0, d.tail()
