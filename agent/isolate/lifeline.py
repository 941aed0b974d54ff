"""The fork server's lifeline: imported first by the qualification fork server (agent.isolate.forkserver's
preload list), it makes the server exit when the process that started it dies, whatever killed it (SIGKILL
included). multiprocessing's server waits for its parent's pipe to close, and a forked worker or any other child
holding that pipe kept it running (seen: a server and its hung worker left behind by a SIGKILLed `conformance`).
The workers it forks die with it (they set PR_SET_PDEATHSIG on the server), so nothing outlives the caller.

Imported anywhere else this module does nothing: it acts only inside a multiprocessing fork server process.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def _in_fork_server() -> bool:
    return any("multiprocessing.forkserver" in arg for arg in getattr(sys, "orig_argv", ()))


def _wait_for_exit(pid: int) -> None:
    """Return once process `pid` is gone: a pidfd where the kernel has one, else a 0.5 s poll."""
    try:
        import select

        fd = os.pidfd_open(pid)  # Linux 5.3+: readable when the process exits
        select.select([fd], [], [])
        return
    except (OSError, AttributeError):
        pass
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.5)


def _watch(pid: int) -> None:
    _wait_for_exit(pid)
    os._exit(0)


if _in_fork_server():
    _PARENT = os.getppid()
    if _PARENT == 1:  # the starter is gone already
        os._exit(0)
    threading.Thread(target=_watch, args=(_PARENT,), name="forkserver-lifeline", daemon=True).start()
