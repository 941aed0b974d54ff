"""The CLI's signal handlers take no lock (agent/cli/signals.py). A handler that sets a threading.Event deadlocks
when the signal lands while the main thread holds that Event's lock inside Event.wait: `fleet simulate` hung in CI
after its SIGTERM, and the daemon's loop had the same shape. Here a process waits in the tightest loop it can while
thousands of signals land at every point of it; it must see them all and end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

WAITER = textwrap.dedent(
    """
    import signal, sys, time
    from agent.cli.signals import SignalFlags

    flags = SignalFlags(tick=(signal.SIGUSR2,), stop=(signal.SIGTERM,))
    seen = 0
    print("ready", flush=True)
    while not flags.raised("stop"):
        flags.wait(0.0005)  # wakes from its timeout thousands of times: the moment an Event.set() deadlocked
        seen += flags.take("tick")
    print("stopped", seen, flush=True)
    """
)


def test_thousands_of_signals_at_every_point_of_the_wait_loop_never_hang_it():
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for _ in range(10000):
            os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(0.0001)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, out
    word, seen = out.split()
    assert word == "stopped" and int(seen) > 0  # signals coalesce between two takes; each one woke the loop
