"""Which providers are usable here, probed in a child process (`python -m agent.lifecycle.probe`) so native
runtime threads never live in the daemon only for a status line, and a crashing probe cannot take it down."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from typing import Any

from agent.errors import ProviderError


class ProviderProbe:
    """Runs the probe child; stop() kills it (daemon shutdown)."""

    def __init__(self, profile: Any, target_name: str | None):
        self.profile, self.target_name = profile, target_name
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def run(self, timeout: float = 120.0) -> list[str]:
        """Names of the available providers, in the target's preference order."""
        if self._stopped:
            return []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "agent.lifecycle.probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = self._proc.communicate(pickle.dumps((self.profile, self.target_name)), timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            raise ProviderError(f"provider probe did not finish within {timeout:.0f}s") from None
        if self._proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {self._proc.returncode}"]
            raise ProviderError(f"provider probe failed: {tail[0]}")
        return list(json.loads(out))

    def stop(self) -> None:
        self._stopped = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


def main() -> None:  # pragma: no cover - runs in the child
    from agent import targets
    from agent.providers.opened import confirm, default_cache
    from agent.providers.ranking import rank

    profile, target_name = pickle.loads(sys.stdin.buffer.read())
    target = targets.resolve(profile, target_name)
    found = confirm(rank(profile, target), profile, default_cache())  # available = a session opened
    json.dump([r.name for r in found if r.available], sys.stdout)


if __name__ == "__main__":  # pragma: no cover
    main()
