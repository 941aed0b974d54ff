"""HealthPublisher (agent.services.health): published once per interval on the service's clock, never without a
link or with interval 0, `disk_full` in the document while the disk is full; a real registry as the figures."""

from __future__ import annotations

from agent.services.health import HealthPublisher, registry_health
from agent.serving.registry import ModelRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_published_once_per_interval():
    clock, sent = Clock(), []
    h = HealthPublisher(10.0, lambda: {"cpu": 1}, lambda: None, publish=sent.append, clock=clock)
    h.tick()
    h.tick()
    assert sent == [{"cpu": 1}]
    clock.now += 9.9
    h.tick()
    assert len(sent) == 1
    clock.now += 0.1
    h.tick()
    assert len(sent) == 2
    h.interval_s = 0  # SIGHUP: telemetry.interval_s 0 turns it off
    clock.now += 100
    h.tick()
    assert len(sent) == 2


def test_nothing_is_published_without_a_link():
    h = HealthPublisher(1.0, lambda: {"cpu": 1}, lambda: None, publish=None, clock=Clock())
    h.tick()  # must not raise
    assert h.doc() == {"cpu": 1}


def test_disk_full_is_in_the_document_while_the_disk_is_full():
    full: list[str | None] = ["/state: No space left on device"]
    figures = {"cpu": 1}
    sent: list[dict] = []
    h = HealthPublisher(1.0, lambda: figures, lambda: full[0], publish=sent.append, clock=Clock())
    h.tick()
    assert sent[-1] == {"cpu": 1, "disk_full": "/state: No space left on device"}
    assert "disk_full" not in figures  # the source's own dict is not changed
    full[0] = None
    assert h.doc() == {"cpu": 1}


def test_without_telemetry_the_registry_stats_are_the_figures():
    registry = ModelRegistry()
    try:
        assert HealthPublisher(1.0, registry_health(registry), lambda: None).doc() == {"models": {}}
    finally:
        registry.close(1)
