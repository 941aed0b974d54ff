"""The device-wide qualification queue: one at a time, first come first served, cancellable while waiting."""

from __future__ import annotations

import threading
import time

import pytest
from support.daemon import wait_for

from agent.lifecycle.context import Cancelled, StepContext
from agent.lifecycle.qualqueue import QualificationQueue


def test_one_at_a_time_in_arrival_order():
    q = QualificationQueue()
    running: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    gate = threading.Event()

    def job(label: str) -> None:
        with q.turn(label, StepContext(None)):
            running.append(label)
            overlaps.append(tuple(running))
            if label == "a":
                gate.wait(30)
            running.remove(label)

    first = threading.Thread(target=job, args=("a",))
    first.start()
    wait_for(lambda: q.snapshot()["running"] == "a", 10, "a running")
    others = []
    for label in ("b", "c", "d"):
        t = threading.Thread(target=job, args=(label,))
        t.start()
        others.append(t)
        wait_for(lambda lab=label: lab in q.snapshot()["waiting"], 10, f"{label} queued")
    assert q.snapshot() == {"running": "a", "waiting": ["b", "c", "d"]}
    gate.set()
    for t in [first, *others]:
        t.join(30)
    assert [w["label"] for w in q.history] == ["a", "b", "c", "d"]
    assert all(len(o) == 1 for o in overlaps)
    spans = [(w["started"], w["finished"]) for w in q.history]
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))


def test_a_queued_deployment_leaves_on_cancel_and_its_deadline_waits():
    q = QualificationQueue()
    gate = threading.Event()

    def hold() -> None:
        with q.turn("a", StepContext(None)):
            gate.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    wait_for(lambda: q.snapshot()["running"] == "a", 10, "a running")
    reports: list[tuple[str, dict]] = []
    ctx = StepContext(time.monotonic() - 1.0, progress=lambda e, **f: reports.append((e, f)))  # deadline passed
    box: dict[str, BaseException] = {}

    def waiter() -> None:
        try:
            with q.turn("b", ctx):
                pass
        except BaseException as exc:  # noqa: BLE001 - inspected below
            box["exc"] = exc

    t = threading.Thread(target=waiter)
    t.start()
    wait_for(lambda: reports, 10, "queued report")
    assert reports[0] == ("queued", {"position": 1, "behind": "a"})
    time.sleep(0.5)  # several polls with the deadline already passed: still waiting, not timed out
    assert t.is_alive() and "exc" not in box
    ctx.cancel_event, ctx.cancel_reason = "supersede", "superseded by version 2"
    ctx.cancel.set()
    t.join(10)
    assert isinstance(box.get("exc"), Cancelled) and str(box["exc"]) == "superseded by version 2"
    assert q.snapshot() == {"running": "a", "waiting": []}
    gate.set()
    holder.join(10)
    with q.turn("c", StepContext(None)) as window:
        assert window["queued_s"] < 5
    assert [w["label"] for w in q.history] == ["a", "c"]


def test_an_exception_in_the_body_hands_over():
    q = QualificationQueue()
    with pytest.raises(RuntimeError):
        with q.turn("a", StepContext(None)):
            raise RuntimeError("boom")
    with q.turn("b", StepContext(None)):
        assert q.snapshot()["running"] == "b"
