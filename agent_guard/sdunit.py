"""The agent as a systemd unit (`edge-agent-guard supervise --systemd edge-agent.service`): systemd runs and
restarts it; for a trial the guard stops and starts the unit with systemctl and reads what systemd knows of it
(`systemctl show`): ActiveState `active` once a Type=notify service sent READY=1, MainPID, NRestarts and
ExecMainStatus once it exited. Standard library only."""

from __future__ import annotations

import subprocess
import time

_PROPS = ("ActiveState", "SubState", "MainPID", "NRestarts", "ExecMainStatus", "Result")


class Unit:
    def __init__(self, unit: str, systemctl: str = "systemctl") -> None:
        self.unit, self.systemctl = unit, systemctl
        self._pid: int | None = None
        self._restarts: str | None = None

    def show(self) -> dict[str, str]:
        args = [self.systemctl, "show", self.unit, *(f"--property={p}" for p in _PROPS)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise OSError(f"systemctl show {self.unit}: {done.stderr.strip() or done.returncode}")
        return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)

    def _ctl(self, *args: str) -> None:
        done = subprocess.run([self.systemctl, *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise OSError(f"systemctl {' '.join(args)}: {done.stderr.strip() or done.returncode}")

    @property
    def alive(self) -> bool:
        return self.show().get("ActiveState") in ("active", "activating", "reloading", "deactivating")

    @property
    def pid(self) -> int | None:
        return self._pid

    def start(self) -> None:
        """Start the unit without waiting for it (wait_ready does); a unit that failed before is reset first."""
        self._ctl("reset-failed", self.unit)
        self._ctl("start", "--no-block", self.unit)
        self._pid, self._restarts = None, None

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the unit is active (READY=1 of a Type=notify service); else why not."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            props = self.show()
            state, sub = props.get("ActiveState"), props.get("SubState")
            if state == "active":
                self._pid, self._restarts = int(props.get("MainPID") or 0) or None, props.get("NRestarts")
                return None
            if state == "failed" or sub == "auto-restart":
                return f"exited with status {props.get('ExecMainStatus')} before READY=1 ({props.get('Result')})"
            time.sleep(0.2)
        return f"no READY=1 within {timeout_s:g} s"

    def exit_reason(self) -> str | None:
        """None while the process that became ready runs; else how it ended (systemd may have restarted it)."""
        props = self.show()
        same = props.get("MainPID") == str(self._pid) and props.get("NRestarts") == self._restarts
        if props.get("ActiveState") == "active" and same:
            return None
        return f"exited with status {props.get('ExecMainStatus')} ({props.get('Result')})"

    def stop(self, timeout_s: float = 60.0) -> None:
        """systemctl stop (the unit's own TimeoutStopSec applies too); SIGKILL to the unit after timeout_s."""
        self._ctl("stop", "--no-block", self.unit)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.show().get("ActiveState") in ("inactive", "failed"):
                return
            time.sleep(0.2)
        self._ctl("kill", "--signal=SIGKILL", self.unit)
        while self.show().get("ActiveState") not in ("inactive", "failed") and time.monotonic() < end + 30:
            time.sleep(0.2)

    def idle(self) -> None:
        return None
