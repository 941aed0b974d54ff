"""Signal handlers that take no lock: each sets a flag and writes a byte to a pipe; the main loop waits on the pipe.

A handler runs in the main thread between two bytecodes, wherever that thread is. `threading.Event.set()` in a
handler deadlocks when the signal lands while the main thread holds that Event's lock inside `Event.wait` (it wakes
from its timeout, takes the lock, and the handler runs on the lock it already holds): a SIGTERM that lands there
hangs the daemon until systemd kills it, and did hang `fleet simulate` in CI. Set-add and os.write take no lock.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterable


class SignalFlags:
    """SignalFlags(stop=(SIGTERM, SIGINT), reload=(SIGHUP,)): `raised(name)`, `take(name)`, `wait(timeout)`."""

    def __init__(self, **names: Iterable[int]):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._raised: set[str] = set()
        for name, signums in names.items():
            for signum in signums:
                signal.signal(signum, self._handler(name))

    def _handler(self, name: str):
        def handle(signum: int, frame: object) -> None:
            self._raised.add(name)
            try:
                os.write(self._w, b"!")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already

        return handle

    def raised(self, name: str) -> bool:
        return name in self._raised

    def take(self, name: str) -> bool:
        """Whether `name` was raised since the last take; clears it."""
        if name in self._raised:
            self._raised.discard(name)
            return True
        return False

    def wait(self, timeout: float) -> None:
        """Until a signal of ours arrives or `timeout` passes."""
        ready, _, _ = select.select([self._r], [], [], timeout)
        if ready:
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass
