"""ControlService (agent.services.control) answering real control files in a tmp state_dir, against a real
Orchestrator with nothing deployed: malformed, expired, cancel of nothing, rollback without a previous version,
and the CLI's own request() round trip."""

from __future__ import annotations

import json
import threading
import time

import pytest

from agent.artifacts.store import ContentStore
from agent.lifecycle import control
from agent.lifecycle.orchestrator import Orchestrator
from agent.lifecycle.steps import Steps
from agent.services.control import ControlService
from agent.serving.registry import ModelRegistry
from agent.util.atomic import read_json


@pytest.fixture
def service(tmp_path):
    store = ContentStore(tmp_path, file_mode=0o600)
    registry = ModelRegistry()
    orchestrator = Orchestrator(tmp_path, Steps(tmp_path, store, registry))
    yield ControlService(tmp_path, orchestrator, registry)
    orchestrator.stop(timeout=5)
    registry.close(1)


def _ask(service, req_id: str, raw: bytes) -> dict:
    """Drop a request file as a CLI would, tick the service until the answer file is there."""
    (service.state_dir / "control").mkdir(exist_ok=True)
    (service.state_dir / "control" / f"{req_id}.req.json").write_bytes(raw)
    req, done = (
        service.state_dir / "control" / f"{req_id}.req.json",
        service.state_dir / "control" / f"{req_id}.done.json",
    )
    for _ in range(600):
        service.tick()
        answer = read_json(done)
        if answer is not None and not req.exists():  # answered, then the request removed
            return answer
        time.sleep(0.05)
    raise AssertionError(f"no answer to {req_id}")


def _req(**fields) -> bytes:
    return json.dumps({"ts": time.time(), **fields}).encode()


def test_a_malformed_request_is_answered_not_executed(service):
    assert _ask(service, "1-bad", b"{not json") == {"ok": False, "error": "malformed control request"}
    assert _ask(service, "2-op", _req(op="delete", model="tiny"))["error"] == "malformed control request"
    assert _ask(service, "3-model", _req(op="cancel", model=7))["error"] == "malformed control request"


def test_an_expired_request_is_not_executed(service):
    old = json.dumps({"op": "cancel", "model": "tiny", "ts": time.time() - control.MAX_AGE_S - 5}).encode()
    assert _ask(service, "1-old", old) == {"ok": False, "error": "request older than 300s: not executed"}
    no_ts = json.dumps({"op": "cancel", "model": "tiny"}).encode()
    assert _ask(service, "2-no-ts", no_ts)["ok"] is False


def test_cancel_of_nothing_in_flight_and_rollback_without_a_previous_version(service):
    assert _ask(service, "1-cancel", _req(op="cancel", model="tiny")) == {
        "ok": False,
        "model": "tiny",
        "error": "nothing in flight for 'tiny'",
    }
    got = _ask(service, "2-rollback", _req(op="rollback", model="tiny"))
    assert got == {"ok": False, "error": "model 'tiny' has no previous version to roll back to"}


def test_the_cli_request_round_trip(service):
    """control.request() as `edge-agent cancel` uses it, while the state_dir lock is held as by the daemon."""
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            service.tick()
            stop.wait(0.05)

    with control.StateLock(service.state_dir):
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            answer = control.request(service.state_dir, "cancel", timeout=30, model="tiny")
        finally:
            stop.set()
            t.join(5)
    assert answer == {"ok": False, "model": "tiny", "error": "nothing in flight for 'tiny'"}
    assert control.pending(service.state_dir) == []
