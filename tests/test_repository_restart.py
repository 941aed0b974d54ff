"""Repository unload survives a restart; load brings the committed version back; load of the previous slot's version
is a journaled rollback; without a serving token, load and unload are refused (403)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from support.agent import make_agent
from support.daemon import deploy

TOKEN = "another-long-serving-token-for-tests"


def _post(url: str, path: str, doc: dict | None = None, token: str | None = TOKEN) -> tuple[int, str]:
    data = json.dumps(doc).encode() if doc is not None else b""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url + path, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _agent(tmp_path, token: bool = True):
    serving: dict = {"host": "127.0.0.1", "port": 0, "shadow": {"duration_s": 1.0}}
    if token:
        (tmp_path / "token").write_text(TOKEN)
        serving["token_file"] = str(tmp_path / "token")
    return make_agent(tmp_path, extra={"serving": serving})


def test_unload_survives_restart_and_load_serves_again(tmp_path):
    a = _agent(tmp_path).start()
    try:
        assert deploy(a, "1").state.value == "committed"
        assert deploy(a, "2").state.value == "committed"
        assert _post(a.url, "/v2/repository/models/tiny/unload") == (200, "")
        assert "tiny" not in a.registry.models()
    finally:
        a.stop()
    b = _agent(tmp_path).start()
    try:
        assert "tiny" not in b.registry.models()  # stays stopped across the restart
        status, body = _post(b.url, "/v2/repository/index", {})
        assert status == 200 and json.loads(body) == [
            {"name": "tiny", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        assert _post(b.url, "/v2/repository/models/tiny/load")[0] == 200
        assert b.registry.models() == {"tiny": "2"}
        status, _ = _post(b.url, "/v2/repository/models/tiny/load", {"parameters": {"version": "1"}})
        assert status == 200 and b.registry.models() == {"tiny": "1"}  # the previous slot, by a rollback
        rollbacks = [d for d in b.orchestrator.journal.all() if d.source.get("kind") == "rollback"]
        assert rollbacks and rollbacks[-1].state.value == "committed"
    finally:
        b.stop()
    c = _agent(tmp_path).start()
    try:
        assert c.registry.models() == {"tiny": "1"}  # loaded again: no unload mark holds it back
    finally:
        c.stop()


def test_load_and_unload_need_a_token(tmp_path):
    a = _agent(tmp_path, token=False).start()
    try:
        assert deploy(a, "1").state.value == "committed"
        status, body = _post(a.url, "/v2/repository/models/tiny/unload", token=None)
        assert status == 403 and "token" in json.loads(body)["error"]
        assert a.registry.models() == {"tiny": "1"}
        status, body = _post(a.url, "/v2/repository/index", {}, token=None)
        assert status == 200 and json.loads(body)[0]["state"] == "READY"
    finally:
        a.stop()
