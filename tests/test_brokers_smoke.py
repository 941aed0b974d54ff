"""The test brokers start and move a message (guards every MQTT integration test), and never outlive pytest."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt


def _roundtrip(broker, protocol):
    got, subscribed = threading.Event(), threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="smoke", protocol=protocol)
    c.on_message = lambda cl, u, m: got.set() if m.payload == b"hi" else None
    c.on_subscribe = lambda *a: subscribed.set()  # the SUBACK, not a guess at how long it takes
    c.connect("127.0.0.1", broker.port)
    c.subscribe("t/x", qos=1)
    c.loop_start()
    try:
        assert subscribed.wait(10), "no SUBACK"
        c.publish("t/x", b"hi", qos=1)
        assert got.wait(10)
    finally:
        c.loop_stop()
        c.disconnect()


def test_mosquitto_roundtrip(mosquitto):
    _roundtrip(mosquitto, mqtt.MQTTv5)


def test_nats_mqtt_roundtrip(nats_mqtt):
    _roundtrip(nats_mqtt, mqtt.MQTTv311)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_test_process_leaves_no_broker_running(tmp_path):
    """kill -9 of the process that started a fixture broker (as when pytest is killed) takes the broker with it."""
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]);"
        "from brokers import Mosquitto; b = Mosquitto(sys.argv[2]).start();"
        "print(b.proc.pid, flush=True); time.sleep(120)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(Path(__file__).parent), str(tmp_path / "m")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        broker_pid = int(child.stdout.readline())
        assert _alive(broker_pid)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while _alive(broker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(broker_pid), f"broker pid {broker_pid} outlived the killed test process"
    finally:
        child.kill()
        child.wait(10)
