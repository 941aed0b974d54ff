"""Through the real service (uvicorn, SQLite, a real Mosquitto): a rollout wave whose device reports its version
"not judged" (a signed, verified status; the device's own key) does not advance without an operator's word. The
API, the rollout page and `fleet unjudged` / `fleet status --control-plane` say "waiting for operator: 1 device
not judged"; the word comes once through the CLI (--accept: the next wave starts) and once through the
dashboard's button (CSRF form; roll back: the device alone is sent a signed rollback to 1, and the rollout ends
once it reports 1 again). Each word is in the audit log; a word with nobody waiting is a 409."""

from __future__ import annotations

import json
import re
import time

import httpx
import paho.mqtt.publish as publish
import pytest
from brokers import Mosquitto
from clirunner import edge_agent
from cp_support import running_service, tiny_tarball, until

from agent.artifacts.keys import device_key, generate
from agent.transport.cpclient import enroll_request as request
from agent.transport.signing import sign_doc
from agent.transport.topics import Topics

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
WAITING = "waiting for operator: 1 device not judged"
PAIRED = {  # what the device reports of its trial's paired timing (agent.fleet.paired)
    "ratio": 1.0412,
    "ci": [0.93, 1.16],
    "pairs": 213,
    "aa": {"ratio": 1.0, "ci": [0.97, 1.03], "pairs": 40},
    "conditions": {"psi_cpu_some_avg10": 41.5, "freq_mhz": 2400},
    "verdict": "not judged",
    "reason": "<b>the interval straddles the A/A floor</b>",
}
SHOWN = (
    "paired ratio 1.04 [0.93, 1.16] over 213 pairs; A/A floor [0.97, 1.03] over 40 pairs; not judged "
    "(&lt;b&gt;the interval straddles the A/A floor&lt;/b&gt;)"
)


class _Device:
    """A device as the service sees it: a signed, retained status under its own key (no daemon needed)."""

    def __init__(self, tmp, dev, port, prefix):
        self.dev, self.port, self.key = dev, port, device_key(tmp / "keys" / dev)
        self.topic = Topics(prefix).status(dev)

    def report(self, version, previous=None, not_judged=False, sha=None, paired=None):
        model = {"version": version, "state": "committed", "provider": "cpu", "previous": previous, "sha256": sha}
        dep = {"version": version, "state": "committed", "result": "committed"}
        if not_judged:
            counts = {"measured": 0, "needed": 64, "contended": 0, "requests": 800, "why": "no baseline: test"}
            dep["probation"] = {"requests": 800, "not_judged": counts}
        if paired is not None:
            dep.setdefault("probation", {})["paired"] = paired
        doc = {"device_id": self.dev, "online": True, "ts": time.time(), "target": "generic-x86_64"}
        doc.update(providers=["cpu"], models={"tiny": model}, deployments={"tiny": dep})
        payload = json.dumps(sign_doc(doc, self.key))
        publish.single(self.topic, payload, qos=1, retain=True, hostname="127.0.0.1", port=self.port)


def test_a_wave_with_a_device_not_judged_waits_for_the_operators_word(tmp_path):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, _, _ = generate(tmp_path / "keys")
        doc = {"mqtt": {"url": broker.url}, "signing_key": str(key), "tick_s": 0.3}
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
            devices = {}
            for dev in ("nj-a", "nj-b"):
                devices[dev] = _Device(tmp_path, dev, broker.port, cp.settings.prefix)
                assert api.post("/api/v1/enroll", json=request(dev, devices[dev].key)).is_success
                assert api.post(f"/api/v1/devices/{dev}/accept", json={"groups": ["lab"]}).status_code == 200
            sha = {}
            for version in ("1", "2"):
                r = api.put(
                    f"/api/v1/models/tiny/versions/{version}", content=tiny_tarball(tmp_path, version).read_bytes()
                )
                assert r.status_code == 201, r.text
                sha[version] = r.json()["sha256"]
            for d in devices.values():
                d.report("1", sha=sha["1"])  # what it runs: the rollout can sign a rollback to it
            until(
                "verified statuses", lambda: all(api.get(f"/api/v1/devices/{d}").json()["status_ts"] for d in devices)
            )
            _own_golden_row_on_the_device_page(api, devices["nj-a"])
            token = tmp_path / "op.token"
            token.write_text(cp.admin_token)
            _run(api, url, token, devices, cp.admin_token)


def _in_progress(api):
    prog = api.get("/api/v1/rollouts/tiny-2").json().get("progress") or {}
    return [d["device_id"] for d in prog.get("devices", []) if d["result"] == "in_progress"]


def _run(api, url, token, devices, admin_token):
    body = {"model": "tiny", "version": "2", "group": "lab", "canary": "1", "wave_size": "1", "deadline_s": 300}
    assert api.post("/api/v1/rollouts", json=body).status_code == 202
    (first,) = until("the canary in flight", lambda: _in_progress(api))
    (second,) = set(devices) - {first}
    assert api.post("/api/v1/rollouts/tiny-2/accept-unjudged").status_code == 409  # nobody waits yet
    devices[first].report("2", previous="1", not_judged=True, paired=PAIRED)
    held = until(
        "the wave held", lambda: (r := api.get("/api/v1/rollouts/tiny-2").json())["waiting_for_operator"] and r
    )
    assert held["waiting_for_operator"] == WAITING and held["progress"]["waiting_for_operator"] == [first]
    time.sleep(1.5)  # several ticks: the next wave does not start on its own
    page = api.get(f"/devices/{first}").text  # the paired ratio and the A/A floor, escaped
    assert f'<td class="paired">{SHOWN}</td>' in page and "<b>the interval" not in page, page
    assert f'<span class="bad">{WAITING}</span>' in api.get("/rollouts").text  # the list says it too
    rollout_page = api.get("/rollouts/tiny-2").text
    assert f'<td class="paired">{SHOWN}</td>' in rollout_page and '<td class="paired">not measured</td>' in rollout_page
    assert _in_progress(api) == [] and api.get("/api/v1/rollouts/tiny-2").json()["waiting_for_operator"] == WAITING

    cli = ("--control-plane", url, "--token-file", token)
    shown = edge_agent("fleet", "status", *cli)
    assert shown.returncode == 0 and WAITING in shown.stdout and "fleet unjudged tiny-2" in shown.stdout, shown
    listed = edge_agent("fleet", "unjudged", "tiny-2", *cli, "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["rollouts"][0]["waiting_for_operator"] == WAITING
    every = edge_agent("fleet", "unjudged", *cli)  # every rollout that waits
    assert every.returncode == 0 and f"{first}: not judged" in every.stdout and WAITING in every.stdout, every
    said = edge_agent("fleet", "unjudged", "tiny-2", *cli, "--accept")
    assert said.returncode == 0 and "accept by" in said.stdout, said
    assert until("the next wave in flight", lambda: _in_progress(api)) == [second]
    accepted = {d["device_id"]: d for d in api.get("/api/v1/rollouts/tiny-2").json()["progress"]["devices"]}[first]
    assert accepted["result"] == "not_judged" and accepted["waiting_for"] is None

    hostile = dict(PAIRED, ci=[0.5, 0.7, 0.9], pairs=10**12)  # not of the schema: the status is not kept
    devices[second].report("2", previous="1", not_judged=True, paired=hostile)
    until("the second wave held", lambda: api.get("/api/v1/rollouts/tiny-2").json()["waiting_for_operator"])
    time.sleep(1.0)
    assert api.get(f"/api/v1/devices/{second}").json()["status"]["deployments"]["tiny"]["version"] == "1"
    assert "10000000000" not in api.get("/rollouts/tiny-2").text  # neither page shows what was refused
    devices[second].report("2", previous="1", not_judged=True)
    browser, csrf = _signed_in(url, admin_token, "/rollouts/tiny-2")
    page = browser.get("/rollouts/tiny-2").text
    assert WAITING in page and 'id="accept-unjudged"' in page and 'id="rollback-unjudged"' in page
    assert browser.post("/rollouts/tiny-2/rollback-unjudged", data={"csrf": "wrong"}).status_code == 403
    r = browser.post("/rollouts/tiny-2/rollback-unjudged", data={"csrf": csrf})
    assert r.status_code == 303
    page = browser.get("/rollouts/tiny-2").text
    assert 'class="error"' not in page, page

    def second_row():
        return {d["device_id"]: d for d in api.get("/api/v1/rollouts/tiny-2").json()["progress"]["devices"]}[second]

    until("the second device's result", lambda: second_row()["result"] != "not_judged")
    assert second_row()["result"] == "rollback_pending", second_row()
    devices[second].report("1", previous="2")  # it went back
    done = until(
        "the rollout finished", lambda: (r := api.get("/api/v1/rollouts/tiny-2").json())["phase"] == "finished" and r
    )
    results = {d["device_id"]: d["result"] for d in done["progress"]["devices"]}
    assert results == {first: "not_judged", second: "rolled_back"} and done["state"] == "completed", done
    actions = [a["action"] for a in api.get("/api/v1/audit").json()["entries"]]
    assert "rollout.accept-unjudged" in actions and "rollout.rollback-unjudged" in actions


def _signed_in(url, token, target):
    c = httpx.Client(base_url=url, timeout=30)
    nonce = re.search(r'name="csrf" value="([^"]*)"', c.get("/login").text).group(1)
    r = c.post("/login", data={"token": token, "next": target, "csrf": nonce})
    assert r.status_code == 303, r.text
    return c, re.search(r'name="csrf" value="([^"]*)"', c.get(target).text).group(1)


def _own_golden_row_on_the_device_page(api, device):
    """A decision record's row compared with golden data its own runtime made says so on the device page."""
    acc = {"max_rel": 0.0, "independent": {"reference": "onnx-reference-evaluator", "max_rel": 1.2e-7}}
    rows = [
        {
            "key": "cpu",
            "provider": "cpu",
            "status": "passed",
            "accuracy": acc,
            "accuracy_basis": "own golden (not independent)",
        },
        {"key": "openvino", "provider": "openvino", "status": "passed", "accuracy": {"max_rel": 3e-6}},
    ]
    doc = {"device_id": device.dev, "model": "tiny", "version": "1", "ts": time.time()}
    signed = sign_doc({**doc, "decision": {"selected": "cpu", "results": rows}}, device.key)
    assert api.post(f"/api/v1/devices/{device.dev}/decisions", json=signed).status_code == 201
    bad = sign_doc({**doc, "decision": {"results": [dict(rows[0], accuracy_basis=["x"])]}}, device.key)
    r = api.post(f"/api/v1/devices/{device.dev}/decisions", json=bad)
    assert r.status_code == 422 and "accuracy_basis" in r.json()["error"], r.text
    page = api.get(f"/devices/{device.dev}").text
    said = "accuracy vs own golden (not independent); vs onnx reference evaluator 1.2e-07"
    assert f'<td>0 <span class="bad own-golden">{said}</span></td>' in page, page
    assert page.count("own-golden") == 1  # the openvino row's golden is not its own
