"""`edge-agent status` and `edge-agent rollback` against a running daemon (control directory) and offline."""

from __future__ import annotations

import json

from clirunner import edge_agent as cli
from support.daemon import Daemon, drop, infer, wait_for, write_config

from agent.lifecycle.fsck import check_state_dir


def test_status_and_rollback_online_and_offline(tmp_path):
    cfg = write_config(tmp_path)
    state = tmp_path / "state"
    d = Daemon(cfg, state)
    try:
        d.wait_ready()
        for v in ("1", "2"):
            drop(state, v)
            assert d.wait_deployment(v)["result"] == "committed", d.tail()
        wait_for(lambda: (d.status() or {}).get("providers_source") == "probed", 180, "provider probe", d.proc)
        out = cli("status", "--config", str(cfg), "--json")
        doc = json.loads(out.stdout)
        assert "cpu" in doc["providers"]  # available here, in target order (generic-x86_64: openvino, cpu)
        assert doc["deployments"]["tiny"]["swap"] in ("make-before-break", "stop-then-start")
        assert "memory malloc_arenas=2" in d.log.read_text()  # capped before any thread started
        assert doc["daemon"] == {"running": True, "pid": d.proc.pid} and doc["problems"] == []
        tiny = doc["models"]["tiny"]
        assert (tiny["version"], tiny["state"], tiny["provider"], tiny["previous"]) == ("2", "committed", "cpu", "1")
        assert len(tiny["sha256"]) == 64 and doc["deployments"]["tiny"]["result"] == "committed"
        assert [r["version"] for r in doc["recent_deployments"]] == ["2", "1"]
        human = cli("status", "--config", str(cfg)).stdout
        assert "daemon running" in human and "tiny" in human and "recent deployments:" in human

        out = cli("rollback", "tiny", "--config", str(cfg))
        assert out.returncode == 0, out.stderr
        assert "serving version 1" in out.stdout
        assert infer(d.url) == ("1", [1.0] * 4)  # took effect in the running daemon, no restart

        out = cli("rollback", "nosuch", "--config", str(cfg))
        assert (
            out.returncode == 1
            and out.stderr.strip()
            == "error: rollback of nosuch failed: model 'nosuch' has no previous version to roll back to"
        )
        assert "Traceback" not in out.stderr
    finally:
        assert d.terminate() == 0, d.tail()

    doc = json.loads(cli("status", "--config", str(cfg), "--json").stdout)
    assert doc["daemon"]["running"] is False and doc["online"] is False
    assert doc["models"]["tiny"]["version"] == "1"
    out = cli("rollback", "tiny", "--config", str(cfg))  # offline: the slots swap on disk
    assert out.returncode == 0 and "daemon serves it when it starts" in out.stdout
    assert json.loads(cli("status", "--config", str(cfg), "--json").stdout)["models"]["tiny"]["version"] == "2"
    assert check_state_dir(state) == []

    d = Daemon(cfg, state)
    try:
        d.wait_ready()
        assert infer(d.url) == ("2", [2.0] * 4)
    finally:
        assert d.terminate() == 0, d.tail()


def test_bad_config_and_busy_state_dir_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("state_dir: [1, 2]\n")
    out = cli("run", "--config", str(bad))
    assert out.returncode != 0 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    cfg = write_config(tmp_path)
    d = Daemon(cfg, tmp_path / "state")
    try:
        d.wait_ready()
        out = cli("run", "--config", str(cfg))
        assert out.returncode == 1 and "in use by another edge-agent" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    finally:
        assert d.terminate() == 0, d.tail()


def test_daemon_speaks_sd_notify(tmp_path):
    cfg = write_config(tmp_path)
    d = Daemon(cfg, tmp_path / "state")  # under a test-bound NOTIFY_SOCKET (support.sdlisten)
    try:
        msgs = d.notify.wait_ready(d.proc, d.log)
        ready = next(m for m in msgs if m.get("READY") == "1")
        assert ready.get("MAINPID") == str(d.proc.pid)
        assert any(m.get("STATUS", "").startswith("serving") for m in msgs), msgs
    finally:
        assert d.terminate() == 0, d.tail()
    assert any(m.get("STOPPING") == "1" for m in d.notify.messages), d.notify.messages


def test_sighup_reloads_the_serving_token(tmp_path):
    import signal
    import urllib.error

    import pytest

    token = tmp_path / "token"
    token.write_text("first-token-0123456789\n")
    token.chmod(0o600)
    cfg = write_config(tmp_path, extra={"serving": {"host": "127.0.0.1", "port": 0, "token_file": str(token)}})
    d = Daemon(cfg, tmp_path / "state")
    try:
        d.wait_ready()
        drop(tmp_path / "state", "1")
        assert d.wait_deployment("1")["result"] == "committed", d.tail()
        assert infer(d.url, token="first-token-0123456789") == ("1", [1.0] * 4)
        token.write_text("second-token-0123456789\n")
        d.proc.send_signal(signal.SIGHUP)
        from support.daemon import wait_for

        wait_for(lambda: "reloaded applied=serving.token_file" in d.tail(), 60, "reload")
        with pytest.raises(urllib.error.HTTPError) as err:
            infer(d.url, token="first-token-0123456789")
        assert err.value.code == 401
        assert infer(d.url, token="second-token-0123456789") == ("1", [1.0] * 4)
        # a token file that is not UTF-8, then one too short: refused with the reason, the running token kept
        for bad, why in ((bytes(range(128, 256)) * 4, "not UTF-8 text"), (b"short\n", "at least 16")):
            token.write_bytes(bad)
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda why=why: why in d.tail(), 60, f"reload refused: {why}", d.proc)
            assert "reload failed, keeping the running config: serving.token_file" in d.tail()
            assert d.proc.poll() is None
            assert infer(d.url, token="second-token-0123456789") == ("1", [1.0] * 4)
    finally:
        assert d.terminate() == 0, d.tail()


def test_cancel_online_and_offline(tmp_path):
    cfg = write_config(tmp_path)
    state = tmp_path / "state"

    def in_probation(d, version):
        def check():
            dep = ((d.status() or {}).get("deployments") or {}).get("tiny") or {}
            return dep if dep.get("version") == version and dep.get("state") == "probation" else None

        return wait_for(check, 120, f"version {version} on probation", d.proc)

    d = Daemon(cfg, state, env={"EDGE_AGENT_PROBATION_S": "600"})  # long enough that only a cancel ends it
    try:
        d.wait_ready()
        drop(state, "1")
        in_probation(d, "1")
        out = cli("cancel", "tiny", "--config", str(cfg))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("tiny: deployment ") and "(version 1) cancelled in state" in out.stdout
        dep = wait_for(
            lambda: ((d.status() or {}).get("deployments") or {}).get("tiny", {}).get("result"),
            60,
            "cancel result",
            d.proc,
        )
        assert dep == "rolled_back"
        out = cli("cancel", "tiny", "--config", str(cfg))  # nothing in flight any more
        assert (
            out.returncode == 1 and out.stderr.strip() == "error: cancel of tiny failed: nothing in flight for 'tiny'"
        )
        drop(state, "2")
        in_probation(d, "2")
    finally:
        assert d.terminate() == 0, d.tail()  # stops with version 2 journaled on probation

    out = cli("cancel", "tiny", "--config", str(cfg), "--json")  # offline: journaled, nothing resumes
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["ok"] and doc["deployment"]["version"] == "2"
    assert doc["deployment"]["state"] == "rolled_back"
    assert check_state_dir(state) == []
    d = Daemon(cfg, state)
    try:
        d.wait_ready()
        status = json.loads(cli("status", "--config", str(cfg), "--json").stdout)
        assert not status["in_flight"] and status["deployments"]["tiny"]["result"] == "rolled_back"
    finally:
        assert d.terminate() == 0, d.tail()
