"""A hostile crowd for the slowloris test, run as its own process: slow-header and idle connections that
reconnect when the server closes them, from several loopback source addresses (127.0.x.y)."""

from __future__ import annotations

import argparse
import errno
import json
import resource
import selectors
import socket
import sys
import threading
import time

SLOW_HEAD = b"GET /v2 HTTP/1.1\r\nHost: x\r\n"
TRICKLE = b"X-Trickle: 1\r\n"  # one byte of it per second, forever
IDLE_BACKOFF_S = 1.0  # an idle client the server closed comes back after this


class Crowd:
    def __init__(self, port: int, slow: int, idle: int, per_addr: int):
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.roles = ["slow"] * slow + ["idle"] * idle
        self.per_addr = per_addr
        self.open: dict[int, tuple[socket.socket, str, int]] = {}  # slot -> (sock, role, bytes sent)
        self.stats = {"connects": 0, "closed_by_server": 0, "connect_errors": 0}
        self.due: list[tuple[float, int]] = []  # (when, slot) reconnects

    def source(self, slot: int) -> str:
        base = 1 if self.roles[slot] == "slow" else 2
        k = slot // self.per_addr
        return f"127.{base}.{k // 250}.{k % 250 + 1}"

    def connect(self, slot: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((self.source(slot), 0))
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", self.port))
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, "connect")
        except OSError:
            s.close()
            self.stats["connect_errors"] += 1
            self.due.append((time.monotonic() + IDLE_BACKOFF_S, slot))
            return
        self.stats["connects"] += 1
        self.open[slot] = (s, self.roles[slot], 0)
        self.sel.register(s, selectors.EVENT_READ, slot)

    def lost(self, slot: int) -> None:
        s, role, _ = self.open.pop(slot)
        self.sel.unregister(s)
        s.close()
        self.stats["closed_by_server"] += 1
        self.due.append((time.monotonic() + (0.05 if role == "slow" else IDLE_BACKOFF_S), slot))

    def run(self, stop: threading.Event) -> None:
        for slot in range(len(self.roles)):
            self.connect(slot)
        next_trickle = time.monotonic()
        while not stop.is_set():
            for key, _ in self.sel.select(0.05):
                slot = key.data
                try:
                    data = key.fileobj.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.lost(slot)
            now = time.monotonic()
            if now >= next_trickle:  # every second: the next byte of each slow head
                next_trickle = now + 1.0
                for slot, (s, role, sent) in list(self.open.items()):
                    if role != "slow":
                        continue
                    chunk = SLOW_HEAD if sent == 0 else TRICKLE[(sent - len(SLOW_HEAD)) % len(TRICKLE) :][:1]
                    try:
                        s.send(chunk)
                        self.open[slot] = (s, role, sent + len(chunk))
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        self.lost(slot)
            if self.due:
                ready = [d for d in self.due if d[0] <= now]
                self.due = [d for d in self.due if d[0] > now]
                for _, slot in ready:
                    self.connect(slot)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--slow", type=int, default=300)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--per-addr", type=int, default=50)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    crowd = Crowd(a.port, a.slow, a.idle, a.per_addr)
    stop = threading.Event()
    t = threading.Thread(target=crowd.run, args=(stop,), daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while len(crowd.open) < len(crowd.roles) * 0.95 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"ready": len(crowd.open)}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    t.join(10)
    print(json.dumps({**crowd.stats, "open": len(crowd.open)}), flush=True)


if __name__ == "__main__":
    main()
