"""Clearing a retained desired state, and finding which prefixes devices report under."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.topics import Topics, check_name


def clear_desired(
    broker: BrokerConfig, prefix: str, model: str, devices: Iterable[str], groups: Iterable[str]
) -> dict[str, Any]:
    """Publish an empty retained message on each desired-state topic (the broker drops the retained one)."""
    check_name(model, "model")
    topics = Topics(prefix)
    names = [topics.device_desired(check_name(d, "device id"), model) for d in devices]
    names += [topics.group_desired(check_name(g, "group"), model) for g in groups]
    link = MqttLink(broker).start()
    try:
        for info in [link.publish(t, b"", qos=1, retain=True) for t in names]:
            info.wait_for_publish(15)
    finally:
        link.stop()
    return {"prefix": prefix, "model": model, "cleared": names}


def heard_prefixes(link: MqttLink, listen_s: float = 2.0) -> list[str]:
    """The topic prefixes (one or two levels) under which devices have a retained status on this broker."""
    seen: set[str] = set()
    got = threading.Event()

    def on(topic: str, payload: bytes, retained: bool) -> None:
        parts = topic.split("/")
        if len(parts) >= 4 and parts[-3] == "devices" and parts[-1] == "status":
            seen.add("/".join(parts[:-3]))
            got.set()

    filters = ["+/devices/+/status", "+/+/devices/+/status"]
    for f in filters:
        link.subscribe(f, on, qos=0)
    got.wait(listen_s)
    got.clear()
    got.wait(0.3)  # retained messages arrive together: a short settle after the first
    for f in filters:
        link.unsubscribe(f)
    return sorted(seen)
