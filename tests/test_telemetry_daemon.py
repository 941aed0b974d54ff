"""Telemetry as the daemon wires it (agent.app.DeviceAgent): a retained health message on a real Mosquitto every
telemetry.interval_s, and the same system figures as gauges on the real /metrics."""

from __future__ import annotations

import json
import threading
import urllib.request

import paho.mqtt.client as mqtt
import pytest
from support.agent import make_agent

from agent.config import parse_config

pytestmark = pytest.mark.slow


def test_health_message_and_metrics(mosquitto, tmp_path):
    from agent.lifecycle.steps import StepConfig

    cfg = parse_config(
        {
            "device_id": "tele-1",
            "state_dir": str(tmp_path / "state"),
            "mqtt": {"url": mosquitto.url},
            "serving": {"port": 0},
            "telemetry": {"interval_s": 0.5},
        }
    )
    agent = make_agent(None, config=cfg, step_config=StepConfig())  # the daemon's own settings
    got, seen = [], threading.Event()

    def on_message(client, userdata, msg):
        doc = json.loads(msg.payload)
        if "memory" in doc:
            got.append((msg.retain, doc))
            seen.set()

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    sub.on_message = on_message
    sub.connect("127.0.0.1", mosquitto.port)
    sub.subscribe("edge/devices/tele-1/health", qos=0)
    sub.loop_start()
    agent.start()
    try:
        assert seen.wait(60), "no health message"
        _, doc = got[0]
        assert doc["device_id"] == "tele-1"
        assert doc["memory"]["total_bytes"] > 0 and doc["cpu"]["cores"] >= 1
        assert doc["disk"]["path"] == str(cfg.state_dir) and doc["disk"]["free_bytes"] > 0
        assert doc["models"] == {}
        with urllib.request.urlopen(f"{agent.url}/metrics", timeout=30) as r:
            text = r.read().decode()
        assert text.count("# TYPE edge_agent_memory_available_bytes gauge") == 1
        assert f'edge_agent_disk_free_bytes{{path="{cfg.state_dir}"}}' in text
        assert "edge_agent_metrics_collector_errors 0" in text
        _assert_each_metric_once(text)
    finally:
        agent.stop()
        sub.loop_stop()
        sub.disconnect()
    # retained: a late subscriber still gets the last one
    late, event = [], threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    c.on_message = lambda cl, u, m: (late.append(m), event.set())
    c.connect("127.0.0.1", mosquitto.port)
    c.subscribe("edge/devices/tele-1/health")
    c.loop_start()
    try:
        assert event.wait(30) and late[0].retain
    finally:
        c.loop_stop()
        c.disconnect()


def _assert_each_metric_once(text: str) -> None:
    """DeviceAgent wires telemetry into /metrics itself: every family is declared once, every series (name and
    labels) is exported once, and the system gauges are all there."""
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), sorted(t for t in set(types) if types.count(t) > 1)
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) == len(set(series)), sorted(s for s in set(series) if series.count(s) > 1)
    gauges = [t for t in types if t.startswith("edge_agent_") and ("memory" in t or "cpu" in t or "disk" in t)]
    assert len(gauges) >= 3, types
