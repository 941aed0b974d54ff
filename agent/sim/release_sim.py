"""Simulated devices take `kind: agent` rollouts (`fleet simulate --agent-release VERSION`): each has a real release
root (releases/<version>/, `current`/`previous` links, guard/ marks and reports) in its state directory. What is
real: the desired state (signed, targeted, verified by the device's MqttSource), the pull of the release archive
over the chunked channel, its unpacking, `release verify` of the wheelhouse against the fleet key, the prune, the
guard's link flips, its roll back, try counting and bad marks (agent_guard.trial.roll_back), its report, signed
by the device key and reported in the status like a real device's. What is not: no venv is built and no process
restarts; the trial's verdict is the simulator's (`--release-fail`: the devices of those classes or targets fail
it, as a release whose golden answer differs would)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAIL_REASON = "simulated: wrong answer for a committed model's golden request (fleet simulate --release-fail)"


class _InProcess:
    """The guard's supervised agent (agent_guard.trial.Agent) as the simulated device has it: the agent in this
    process, never stopped or started, always ready."""

    pid: int | None = None

    def start(self) -> None:
        return None

    def stop(self, timeout_s: float = 60.0) -> None:
        return None

    def wait_ready(self, timeout_s: float) -> str | None:
        return None

    def exit_reason(self) -> str | None:
        return None

    def idle(self) -> None:
        return None


def lay_out(root: Path, version: str) -> None:
    """The first release of a simulated device's root (as `install.sh --release` leaves it): current -> version."""
    from agent_guard import links

    if links.target(root, links.CURRENT) is None:
        links.write_json(root / "releases" / version / "installed.json", {"version": version, "simulated": True})
        links.set_link(root, links.CURRENT, version)


class FailRule:
    """`--release-fail CLASS[:K]`: the trials of that class's (or target's) devices fail, but for the first K
    (counted over the class: the canary, say) and but for the release the devices came with (a roll back to it
    passes)."""

    def __init__(self, spec: str, first: str):
        name, _, passes = spec.partition(":")
        self.name, self.first, self.passes = name, first, int(passes or 0)
        self._lock = threading.Lock()

    def fails(self, version: str) -> bool:
        if version == self.first:
            return False
        with self._lock:
            if self.passes > 0:
                self.passes -= 1
                return False
        return True


class SimulatedTrial:
    """The simulator's Applier (agent.services.release_update): verify and lay out, then the trial's steps."""

    def __init__(self, fails: Callable[[str], bool], trial_s: float = 0.5, max_tries: int = 3):
        """`fails(version)`: does this trial fail (asked once per trial)?"""
        self.fails, self.trial_s, self.max_tries = fails, trial_s, max_tries

    def install(self, root: Path, wheelhouse: Path, version: str, trusted: dict[str, Any]) -> None:
        from agent.errors import EdgeAgentError
        from agent.release import manifest
        from agent.release.install import INSTALLED, prune
        from agent_guard import links

        doc = manifest.verify(wheelhouse, trusted)  # refused before anything is written, as on a device
        if str(doc["version"]) != version:
            raise EdgeAgentError(f"the wheelhouse is release {doc['version']}, the manifest names {version}")
        if links.is_bad(root, version):
            raise EdgeAgentError(f"release {version} is marked bad on this device")
        prune(root, keep_extra=(version,))
        dest = root / "releases" / version
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(wheelhouse, dest / "wheelhouse")
        links.write_json(dest / INSTALLED, {"version": version, "installed": time.time(), "simulated": True})

    def trial(self, root: Path, version: str) -> None:
        from agent.errors import EdgeAgentError
        from agent_guard import links
        from agent_guard.trial import Limits, finish, roll_back, step

        if links.is_bad(root, version):  # as `release activate` refuses it (agent.release.trial.ask)
            raise EdgeAgentError(f"release {version} is marked bad on this device")

        doc: dict[str, Any] = {
            "version": version,
            "from": links.target(root, links.CURRENT),
            "started": time.time(),
            "try": links.tries(root, version) + 1,
            "simulated": True,
        }
        for name in ("stopping", "flipping"):
            step(root, doc, name)
        links.flip(root, version)
        step(root, doc, "starting")
        time.sleep(self.trial_s)  # the trial in progress: the status says so meanwhile
        if self.fails(version):
            limits = Limits(max_tries=self.max_tries)
            roll_back(root, _InProcess(), doc, FAIL_REASON, limits)
            return
        step(root, doc, "ready")
        step(root, doc, "good")
        links.tries_clear(root, version)
        finish(root, doc, "good", None)
