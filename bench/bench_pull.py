#!/usr/bin/env python3
"""Benchmark the MQTT artifact channel against raw paho on the same loopback Mosquitto, in the same run.

    .venv/bin/python bench/bench_pull.py [--size-mb 64] [--rss-size-mb 256] [--chunk-size 262144] [--window CHUNKS]
                                         [--rounds 3] [--broker-nagle]

Prints three figures and their goals:
  throughput   pull of a SIZE artifact (ArtifactServer -> Mosquitto -> ChunkPuller, verified, on disk) divided by
               raw paho publish -> subscribe of the same bytes in the same chunks, QoS 1     goal >= 0.8x
  rss          device peak RSS growth while pulling RSS_SIZE                                  goal <= 32 MB
  resent       bytes sent twice when the device is SIGKILLed mid-pull and restarted          goal <= 1 % of the file
The device side always runs in its own process (as on a real device). Not run by the test suite.
The broker runs with `set_tcp_nodelay true`, as scripts/mosquitto/mosquitto.conf ships it (chunk requests and
PUBACKs are small, and Nagle's algorithm holds small writes up to 40 ms); the clients always set TCP_NODELAY.
--broker-nagle measures a broker left at Mosquitto's default (`set_tcp_nodelay false`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# --- child processes ---------------------------------------------------------------------------------
def child_sub(url: str, count: int) -> None:
    """Raw paho subscriber: report when `count` messages have arrived."""
    import paho.mqtt.client as mqtt

    host, port = url.split("//")[1].split(":")
    done, n = threading.Event(), [0]

    def on_message(c, u, msg):
        n[0] += 1
        if n[0] == count:
            done.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-sub", protocol=mqtt.MQTTv5)
    c.on_message = on_message
    c.on_subscribe = lambda *a: print("ready", flush=True)
    c.on_connect = lambda cl, *a: cl.subscribe("bench/raw", qos=1)
    c.connect(host, int(port))
    c.loop_start()
    cpu0 = cpu_s()
    done.wait()
    print("done", time.time(), cpu_s() - cpu0, flush=True)
    c.loop_stop()


def child_pull(url: str, store: str, manifest_file: str, window: int, progress: bool) -> None:
    from agent.artifacts.manifest import Manifest
    from agent.artifacts.pull import ChunkPuller
    from agent.artifacts.store import ContentStore
    from agent.transport.device import DeviceLink

    m = Manifest.from_dict(json.loads(Path(manifest_file).read_text()))
    import psutil

    link = DeviceLink(url, "bench-dev").start(wait=15)
    proc, peak, stop = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample():
        while not stop.wait(0.005):
            peak[0] = max(peak[0], proc.memory_info().rss)

    threading.Thread(target=sample, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.readline()
    t0, cpu0 = time.time(), cpu_s()

    def cb(event, done=0, total=1, **_):
        print(event, done, flush=True)
        if event == "chunk" and done >= total // 2:
            print("paused", done, flush=True)
            sys.stdin.readline()  # wait for the SIGKILL (chunks in flight keep arriving, then die with us)

    if m.artifact.recipe is not None:  # a delta-capable manifest (what fleet push emits): the device's own path
        from agent.artifacts.delta import fetch_delta

        _, moved = fetch_delta(m, ContentStore(store), link=link, window=window or None)
        stop.set()
        stats = dict(moved, cpu_s=cpu_s() - cpu0, window=window)
    else:
        puller = ChunkPuller(link, ContentStore(store), window=window or None, progress=cb if progress else None)
        puller.pull(m)
        stop.set()
        stats = dict(puller.stats, cpu_s=cpu_s() - cpu0)
        stats["window"] = puller.window
    print(
        "done",
        t0,
        time.time(),
        base // 1024,
        max(peak[0], proc.memory_info().rss) // 1024,
        json.dumps(stats, separators=(",", ":")),
        flush=True,
    )
    link.stop()


# --- parent ------------------------------------------------------------------------------------------
def spawn(*args):
    return subprocess.Popen(
        [sys.executable, __file__, *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def expect(proc, word):
    for line in proc.stdout:
        if line.split()[0] == word:
            return line.split()[1:]
    raise RuntimeError(f"child exited before '{word}' (rc {proc.wait()})")


def raw_paho(url: str, data: bytes, chunk: int) -> float:
    """Seconds to move `data` in `chunk`-sized QoS 1 messages publisher -> Mosquitto -> subscriber."""
    import paho.mqtt.client as mqtt

    count = -(-len(data) // chunk)
    sub = spawn("_sub", url, count)
    expect(sub, "ready")
    host, port = url.split("//")[1].split(":")
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-pub", protocol=mqtt.MQTTv5)
    pub.max_inflight_messages_set(64)  # the strongest plain-paho sender: everything queued, 64 in flight
    pub.connect(host, int(port))
    pub.loop_start()
    t0 = time.time()
    view = memoryview(data)
    for i in range(count):
        pub.publish("bench/raw", bytes(view[i * chunk : (i + 1) * chunk]), qos=1)
    t1, cpu = map(float, expect(sub, "done"))
    pub.loop_stop()
    sub.wait(30)
    return t1 - t0, cpu


def make(tmp: Path, size: int, chunk: int):
    from agent.artifacts.manifest import Manifest
    from agent.artifacts.store import ContentStore, hash_file

    cp = ContentStore(tmp / f"cp-{size}")
    data = os.urandom(size)
    sha = cp.put_bytes(data)
    _, n, hashes = hash_file(cp.path(sha), chunk)
    m = Manifest.create(
        name="bench", version="1", sha256=sha, size=n, chunk_size=chunk, chunks=hashes, devices=["bench-dev"]
    )
    mf = tmp / f"m-{size}.json"
    mf.write_text(json.dumps(m.to_dict()))
    from agent.artifacts.recipe import RecipeBook

    md = Manifest.create(  # the same artifact as `fleet push` emits it now: with a chunk recipe
        name="bench",
        version="1",
        sha256=sha,
        size=n,
        chunk_size=chunk,
        chunks=hashes,
        devices=["bench-dev"],
        recipe=RecipeBook(cp).ensure(sha),
    )
    (tmp / f"md-{size}.json").write_text(json.dumps(md.to_dict()))
    return cp, m, data, mf


def verified_bytes(store_dir: Path, m) -> int:
    """Bytes of the staging file that already match their chunk hashes (read-only look after the kill)."""
    import hashlib

    a, total = m.artifact, 0
    with open(Path(store_dir) / "staging" / f"{a.sha256}.part", "rb") as f:
        for i, h in enumerate(a.chunks):
            block = f.read(a.chunk_len(i))
            if hashlib.sha256(block).hexdigest() == h:
                total += len(block)
    return total


def pull_once(url, store, mf, window, kill=False):
    proc = spawn("_pull", url, store, mf, window, int(kill))
    expect(proc, "ready")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    if kill:
        done = int(expect(proc, "paused")[0])
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        return done
    t0, t1, base, peak, stats = expect(proc, "done")
    proc.wait(30)
    return float(t1) - float(t0), (int(peak) - int(base)) / 1024, json.loads(stats)


def main() -> int:
    ap = argparse.ArgumentParser(description="MQTT artifact pull benchmark")
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--rss-size-mb", type=int, default=256)
    ap.add_argument("--chunk-size", type=int, default=256 * 1024)
    ap.add_argument("--window", type=int, default=0, help="chunks in flight (default: 16 MiB worth)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--broker-nagle",
        action="store_true",
        help="set_tcp_nodelay false (Mosquitto's own default) instead of the shipped config's true",
    )
    args = ap.parse_args()
    from brokers import Mosquitto

    from agent.fleet.artifact_server import ArtifactServer
    from agent.transport.mqtt import BrokerConfig

    chunk, size = args.chunk_size, args.size_mb << 20
    conf = "set_tcp_nodelay false" if args.broker_nagle else ""  # tests/brokers.py sets it true, as shipped
    with (
        tempfile.TemporaryDirectory() as td,
        Mosquitto(Path(td) / "broker", persistence=False, extra_conf=conf) as broker,
    ):
        tmp = Path(td)
        cp, m, data, mf = make(tmp, size, chunk)
        server = ArtifactServer(cp, BrokerConfig(broker.url)).start()
        raws, pulls, raw_cpu, pull_cpu, deltas, delta_cpu = [], [], [], [], [], []
        for r in range(args.rounds):  # interleaved: a shared, noisy machine hits both alike
            wall, cpu = raw_paho(broker.url, data, chunk)
            raws.append(wall)
            raw_cpu.append(cpu)
            wall, _, stats = pull_once(broker.url, tmp / f"dev1-{r}", mf, args.window)
            pulls.append(wall)
            pull_cpu.append(stats["cpu_s"])
            wall, _, dstats = pull_once(broker.url, tmp / f"devd-{r}", tmp / f"md-{size}.json", args.window)
            deltas.append(wall)
            delta_cpu.append(dstats["cpu_s"])
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        raw_s, pull_s = med(raws), med(pulls)
        ratio = raw_s / pull_s
        print(
            f"throughput: raw paho {size / raw_s / 1e6:.0f} MB/s, pull {size / pull_s / 1e6:.0f} MB/s "
            f"-> {ratio:.2f}x (goal >= 0.8x)  [median of {args.rounds}: raw {[round(size / x / 1e6) for x in raws]}, "
            f"pull {[round(size / x / 1e6) for x in pulls]} MB/s; {args.size_mb} MB, chunk {chunk}, window {stats['window']} "
            f"chunks, chunk round trip {stats.get('rtt_ms')} ms, timeout {stats.get('timeout_ms')} ms, "
            f"broker nodelay {not args.broker_nagle}]"
        )
        delta_s = med(deltas)
        print(
            f"fresh pull of a delta-capable manifest (recipe; agent.artifacts.delta.fetch_delta, nothing to reuse): "
            f"{size / delta_s / 1e6:.0f} MB/s -> {raw_s / delta_s:.2f}x raw paho, {pull_s / delta_s:.2f}x the plain "
            f"pull (goal >= 0.8x raw)  [{[round(size / x / 1e6) for x in deltas]} MB/s]"
        )
        paired = lambda a, b: med([x / y for x, y in zip(a, b)])  # noqa: E731 - per round: same moment's noise
        print(
            f"paired per round (median of the rounds' own ratios): plain pull {paired(raws, pulls):.2f}x raw paho, "
            f"delta-capable pull {paired(raws, deltas):.2f}x raw paho, {paired(pulls, deltas):.2f}x the plain pull"
        )
        print(
            f"cpu: receiving side {med(pull_cpu):.2f} s for the pull (verify every chunk, write, hash the file), "
            f"{med(delta_cpu):.2f} s for the delta-capable pull, vs {med(raw_cpu):.2f} s for the raw subscriber "
            "(count messages)"
        )

        before, skipped = server.stats["bytes"], server.stats["cancelled"] + server.stats["superseded"]
        killed_at = pull_once(broker.url, tmp / "dev2", mf, args.window, kill=True)
        on_disk = verified_bytes(tmp / "dev2", m)
        _, _, stats = pull_once(broker.url, tmp / "dev2", mf, args.window)
        refetched = stats["requested"] * chunk - (size - on_disk)
        overhead = server.stats["bytes"] - before - size
        resent = max(0, refetched)
        print(
            f"resent: killed after {killed_at} bytes were reported written; {on_disk} verified bytes on disk; "
            f"the restart requested {stats['requested']} of {stats['chunks']} chunks -> {resent} bytes "
            f"downloaded twice = {100 * resent / size:.2f} % (goal <= 1 %); server-side overhead incl. the "
            f"chunks in flight when the process died: {overhead} bytes = {100 * overhead / size:.2f} % "
            f"(answers the server skipped for a dead or re-asking device: "
            f"{server.stats['cancelled'] + server.stats['superseded'] - skipped})"
        )
        del data

        cp2, m2, data2, mf2 = make(tmp, args.rss_size_mb << 20, chunk)
        del data2
        server.stop()
        server = ArtifactServer(cp2, BrokerConfig(broker.url)).start()
        _, growth, _ = pull_once(broker.url, tmp / "dev3", mf2, args.window)
        print(f"rss: device peak RSS grew {growth:.1f} MB while pulling {args.rss_size_mb} MB (goal <= 32 MB)")
        server.stop()
        ok = ratio >= 0.8 and raw_s / delta_s >= 0.8 and growth <= 32 and resent <= size / 100
        print("all goals met" if ok else "some goals missed")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_sub"]:
        child_sub(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["_pull"]:
        child_pull(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1")
    else:
        sys.exit(main())
