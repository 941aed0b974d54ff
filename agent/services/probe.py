"""ProviderProbeService: which providers are usable here, for the status document.

Probed once in the background (lifecycle.probe: a child process); until it answers, the last probe's list
(status.json, same target) stands in. `source` says where the list came from: given, pending, last probe,
probed, or probe failed: <reason>.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError
from agent.lifecycle.status_doc import status_path
from agent.services import Emit


class ProviderProbeService:
    def __init__(
        self,
        state_dir: str | Path,
        profile: Any,
        target_name: str | None,
        *,
        known: list[str] | None,
        on_probed: Callable[[], Any],
        emit: Emit,
    ):
        """`known`: the providers the caller knows are available (no probe); `on_probed`: called once a probe
        answered (the daemon republishes its status)."""
        self.state_dir, self.profile, self.target_name = Path(state_dir), profile, target_name
        self.known = list(known) if known is not None else None
        self.on_probed, self.emit = on_probed, emit
        self.available: list[str] = list(known or [])
        self.source = "given" if known is not None else "pending"
        self._probe: Any = None  # lifecycle.probe.ProviderProbe once started
        self._stopped = threading.Event()

    def providers(self) -> list[str]:
        """Providers available on this device, in the target's preference order."""
        return list(self.available)

    def start(self) -> None:
        """The last probe's list stands in, then the probe runs in the background (not when `known`)."""
        if self.known is not None:
            return
        from agent.lifecycle.probe import ProviderProbe

        self.load_last()
        self._probe = ProviderProbe(self.profile, self.target_name)
        threading.Thread(target=self._run, name="probe-providers", daemon=True).start()

    def load_last(self) -> None:
        """The providers status.json lists, when it was written for this target (an unreadable one: none)."""
        from agent.util.atomic import read_json

        try:
            last = read_json(status_path(self.state_dir)) or {}
        except ValueError:
            last = {}
        if not isinstance(last, dict):
            return
        if isinstance(last.get("providers"), list) and last.get("target") == self.target_name:
            self.available, self.source = [str(p) for p in last["providers"]], "last probe"

    def stop(self) -> None:
        self._stopped.set()
        if self._probe is not None:
            self._probe.stop()

    def _run(self) -> None:
        try:
            self.available, self.source = self._probe.run(), "probed"
        except EdgeAgentError as exc:
            if not self._stopped.is_set():
                self.source = f"probe failed: {exc}"
                self.emit({"event": "warning", "reason": str(exc)})
            return
        if not self._stopped.is_set():
            self.on_probed()
