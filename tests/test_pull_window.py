"""Adaptive request timeout: the estimator and window on a virtual clock, then a lost answer on a real broker."""

import collections
import threading

from test_pull import make_artifact

from agent.artifacts.pull import ChunkPuller
from agent.artifacts.store import ContentStore
from agent.artifacts.window import InFlight, RttEstimator
from agent.fleet.artifact_server import ArtifactServer
from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig


def test_timeout_follows_round_trips_within_bounds_and_backs_off():
    rtt = RttEstimator(initial=5.0, lo=0.5, hi=20.0)
    assert rtt.timeout == 5.0  # nothing measured yet
    for _ in range(20):
        rtt.sample(0.01)
    assert rtt.timeout == 0.5  # fast path: the lower bound, not 4 x 10 ms
    for s in [2.0, 3.0, 2.5, 3.5] * 10:
        rtt.sample(s)
    assert 2.5 < rtt.srtt < 3.5 and rtt.srtt + 4 * rtt.rttvar == rtt.timeout
    base = rtt.timeout
    rtt.expired()
    assert rtt.timeout == 2 * base
    for _ in range(5):
        rtt.expired()
    assert rtt.timeout == 20.0  # capped
    rtt.sample(3.0)
    assert rtt.timeout < 2 * base  # a fresh round trip ends the backoff


def test_only_chunks_older_than_the_timeout_are_due_oldest_first_and_karn_applies():
    rtt = RttEstimator(initial=1.0, lo=1.0, hi=10.0)
    flight = InFlight(rtt)
    flight.add([0, 1], now=0.0)
    flight.add([2, 3], now=0.8)
    assert flight.overdue(0.9) == [] and flight.next_deadline() == 1.0
    assert flight.overdue(1.5) == [0, 1]  # 2 and 3 are younger than the timeout: not asked again
    assert len(flight) == 2 and rtt.timeout == 2.0  # backed off
    flight.add([1], now=1.5)  # re-requested
    assert flight.land(1, 1.6) is None and rtt.samples == 0  # ambiguous answer: no sample (Karn)
    assert flight.land(2, 1.8) == 1.0 and rtt.samples == 1
    assert flight.land(7, 1.9) is None  # never requested: ignored


def simulate(rtt: RttEstimator, count=256, window=64, service=0.12, lose=(), dedupe=False):
    """One device pulling from a server that answers one chunk every `service` seconds, first come first
    served (a server shared by ~200 devices): returns how many answers were sent beyond `count`."""
    flight, queue, have, lost = InFlight(rtt), collections.deque(), set(), set(lose)
    missing, t, sent, last_sent = collections.deque(range(count)), 0.0, 0, {}

    def fill():
        while missing and len(flight) < window:
            i = missing.popleft()
            if i not in have and i not in flight:
                flight.add([i], t)
                queue.append((i, t))

    fill()
    while len(have) < count:
        t += service
        while queue:
            i, asked = queue.popleft()
            if dedupe and last_sent.get(i, -1.0) >= asked:
                continue  # the artifact server's rule: already sent after this request arrived
            sent, last_sent[i] = sent + 1, t
            if i in lost:
                lost.discard(i)  # this answer never arrives
            elif i not in have:
                have.add(i)
                flight.land(i, t)
            break
        missing.extendleft(reversed(flight.overdue(t)))
        fill()
    return sent - count


def test_a_loaded_server_draws_no_duplicate_storm():
    fixed = simulate(RttEstimator(initial=5.0, lo=5.0, hi=5.0))  # the old fixed 5 s timeout
    adaptive = simulate(RttEstimator(initial=5.0, lo=0.5, hi=20.0))
    assert fixed > 256  # more than twice the traffic: the problem seen with 200 devices
    assert adaptive == 0
    assert simulate(RttEstimator(initial=5.0, lo=5.0, hi=5.0), dedupe=True) == 0  # the server's own guard


def test_lost_answers_are_asked_for_again_and_only_they():
    assert simulate(RttEstimator(initial=5.0, lo=0.5, hi=20.0), lose={3, 100, 255}) == 3


class DroppingServer(ArtifactServer):
    """A real server whose first answer for chunk 5 is lost on the way (a broker restart, a dropped message)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.asked, self.dropped = [], False
        self._drop_lock = threading.Lock()

    def _serve(self, device, req, received, infos):
        self.asked.append(tuple(req.indices))
        with self._drop_lock:
            drop = 5 in req.indices and not self.dropped
            self.dropped = self.dropped or drop
        if drop:
            req = type(req)(req.sha256, req.chunk_size, tuple(i for i in req.indices if i != 5))
            if not req.indices:
                return
        super()._serve(device, req, received, infos)


def test_a_lost_answer_is_requested_again_without_the_rest_of_the_window(mosquitto, tmp_path):
    cp, m, data = make_artifact(tmp_path / "cp", 40 * 64 * 1024)
    server = DroppingServer(cp, BrokerConfig(mosquitto.url)).start()
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    try:
        puller = ChunkPuller(dev, ContentStore(tmp_path / "dev"), window=8, min_request_timeout=2.0, stall_timeout=60)
        assert puller.pull(m).read_bytes() == data
    finally:
        dev.stop()
        server.stop()
    counts = collections.Counter(i for batch in server.asked for i in batch)
    assert server.dropped and counts[5] >= 2
    again = {i for i, n in counts.items() if n > 1}
    assert again == {5}, f"re-requested {sorted(again)}: only the lost chunk should be"
    assert puller.stats["retries"] == counts[5] - 1


def test_mqtt_sockets_do_without_nagle_also_after_a_reconnect(tmp_path):
    import socket

    from brokers import Mosquitto

    def nodelay(link) -> int:
        return link._mqtt._client.socket().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    with Mosquitto(tmp_path / "b") as broker:
        dev = DeviceLink(broker.url, "pi-1").start(wait=15)
        try:
            assert nodelay(dev) != 0  # set by MqttLink on every socket: paho's default leaves Nagle on
            before = dev._mqtt._client.socket()
            broker.restart()
            seen: list = []  # the link's ConnectionEvents: a drop, then a new connection
            while not (False in seen and seen[-1] is True):
                event = dev.events.raw.get(timeout=30)
                if event.kind == "connection":
                    seen.append(event.connected)
            assert dev._mqtt._client.socket() is not before and nodelay(dev) != 0
        finally:
            dev.stop()
