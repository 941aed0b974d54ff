"""Issue 37's "done when", as an operator runs it, with real parts only: a running control plane (SQLite), a real
Mosquitto and a real local webhook receiver (an HTTP server in this test). `edge-agent fleet simulate
--control-plane URL --enroll-token-file F --telemetry-interval 1` (a subprocess: 20 real device agents of two
hardware classes) enrolls into the running service: the API lists 20 accepted. In Debian's chromium (Playwright):
package v1 uploaded on /models (its progress seen) and rolled out to all from its version page, all 20 commit it;
v2 uploaded the same way and rolled out with a canary and a rate of 3 devices a minute (simulated devices serve no
traffic: a quiet probation window passes); once the canary and one device of the next wave took v2 and before the
next is released, the operator halts it from the rollout page (mid-wave, deterministically) and rolls it back from there: every device ends on v1 (the API agrees). The evidence matrix shows both hardware classes with the provider
their devices chose, the charts draw the devices' health messages, and the halt's alert is on /alerts and was
POSTed to the webhook. Screenshots `operator-*.png` go to $EDGE_AGENT_ARTIFACTS/control-plane/ (default
test-artifacts/control-plane/)."""

from __future__ import annotations

import json

import httpx
import pytest
from brokers import Mosquitto
from cp_support import artifacts_dir, browser_page, need_chromium, running_service
from support.httpd import LoopbackHTTP, QuietHandler
from support.stop import stop
from support.wait import wait_for
from test_controlplane_dashboard import _package
from test_simulate_controlplane import _events, _simulate

from agent.artifacts.keys import generate

CLASSES = ("amd-epyc-x86", "rpi5-8gb")
DEVICES = 20
WAIT_S = 300.0  # generous for a loaded 2-CPU host; a pass takes far less

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


class Receiver(LoopbackHTTP):
    """A webhook receiver on a free loopback port: answers 200 and keeps every JSON body it was sent."""

    def __init__(self):
        got = self.got = []

        class Handler(QuietHandler):
            def do_POST(self):
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.answer(200)

        super().__init__(Handler, "/hook")


def _devices(api) -> list[dict]:
    return api.get("/api/v1/devices", params={"state": "accepted", "limit": 1000}).json()["devices"]


def _on(api, version: str, state: str = "committed") -> bool:
    rows = _devices(api)
    tiny = [(r["models"].get("tiny") or {}) for r in rows]
    return len(rows) == DEVICES and all(m.get("version") == version and m.get("state") == state for m in tiny)


def test_an_operator_runs_a_simulated_fleet_from_the_browser(tmp_path):
    need_chromium()
    hook = Receiver()
    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        doc = {
            "mqtt": {"url": broker.url},
            "signing_key": str(key),
            "tick_s": 0.3,
            "telemetry": {"bucket_s": 1, "max_points": 600},
            "alerts": {"check_s": 0.5, "webhook": {"url": hook.url, "backoff_s": 0.1}},
        }
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
            grant = api.post("/api/v1/enroll-tokens", json={"name": "sim", "groups": ["lab"], "uses": DEVICES})
            assert grant.status_code == 201, grant.text
            (tmp_path / "enroll.token").write_text(grant.json()["token"] + "\n")
            sim = _simulate(
                tmp_path, "op", broker.url, pub, url,
                *("--devices", str(DEVICES), "--sysroots", ",".join(CLASSES)),
                *("--enroll-token-file", "enroll.token", "--telemetry-interval", "1"),
            )  # fmt: skip
            try:
                targets = _enrolled(api)
                with browser_page() as page:
                    _operate(page, url, cp, api, tmp_path, hook, targets)
            finally:
                code = stop(sim)
                api.close()
                hook.close()
            log = (tmp_path / "op.out").read_text()[-3000:]
            assert code == 0 and _events(tmp_path, "op")[-1]["event"] == "stopped", log


def _enrolled(api) -> list[str]:
    """20 devices enrolled by themselves with the token, accepted, their verified statuses in, both classes."""

    def ready():
        rows = _devices(api)
        return len(rows) == DEVICES and all(r["status_ts"] and r["online"] for r in rows) and rows

    rows = wait_for(ready, WAIT_S, f"{DEVICES} accepted devices with verified statuses", step=0.5)
    assert all(r["decided_by"] == "token:sim" and r["groups"] == ["lab"] for r in rows), rows
    targets = sorted({r["target"] for r in rows})  # the hardware classes as the devices report them
    assert len(targets) == len(CLASSES) and all(sum(r["target"] == t for r in rows) == DEVICES // 2 for t in targets)
    return targets


def _operate(page, url, cp, api, tmp, hook, targets) -> None:
    shots = artifacts_dir()
    page.goto(url + "/login")
    page.fill("input[name=token]", cp.admin_token)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")
    _upload(page, url, tmp, "1")
    _start_rollout(page, url, canary="0", wave_size="100%")
    done = wait_for(lambda: (r := api.get("/api/v1/rollouts/tiny-1").json())["phase"] == "finished" and r, WAIT_S,
                    "tiny-1 finished")  # fmt: skip
    assert done["state"] == "completed", done["progress"]["devices"]
    wait_for(lambda: _on(api, "1"), WAIT_S, "every device committed on tiny 1", step=0.5)
    _upload(page, url, tmp, "2")
    page.screenshot(path=str(shots / "operator-upload.png"), full_page=True)
    _start_rollout(page, url, canary="1", wave_size="100%", rate="3")
    _halt_mid_wave(page, url, api)
    page.screenshot(path=str(shots / "operator-halted.png"), full_page=True)
    _roll_back(page, url, api)
    page.screenshot(path=str(shots / "operator-rolled-back.png"), full_page=True)
    _matrix(page, url, api, targets)
    page.screenshot(path=str(shots / "operator-evidence.png"), full_page=True)
    _charts(page, url, api, targets[-1])
    page.screenshot(path=str(shots / "operator-charts.png"), full_page=True)
    _alert(page, url, api, hook)
    page.screenshot(path=str(shots / "operator-alerts.png"), full_page=True)


def _upload(page, url, tmp, version: str) -> None:
    """Package `version` uploaded on /models, its progress seen as the browser reported it."""
    seen: list[str] = []
    page.goto(url + "/models")
    page.expose_function(f"seenUpload{version}", lambda text: seen.append(text))
    page.evaluate(
        """(fn) => { const s = document.getElementById('upload-status'), b = document.getElementById('upload-progress');
        new MutationObserver(() => window[fn](s.textContent + ' | ' + b.value + '/' + b.max))
          .observe(document.getElementById('upload'), {subtree: true, childList: true, characterData: true,
                                                         attributes: true}); }""",
        f"seenUpload{version}",
    )
    page.set_input_files("input[name=package]", str(_package(tmp, version)))
    page.fill("input[name=name]", "tiny")
    page.fill("input[name=version]", version)
    page.click("#upload button[type=submit]")
    page.wait_for_url(url + f"/models/tiny/{version}")
    assert any("(100%)" in s for s in seen), seen
    assert "package --check: ok" in page.inner_text("#checked")


def _start_rollout(page, url, canary: str, wave_size: str, rate: str = "") -> None:
    """A rollout of the version whose page is open, to group lab, started from that page."""
    version = page.url.rsplit("/", 1)[1]
    page.select_option("#start-rollout select[name=group]", "lab")
    page.fill("#start-rollout input[name=canary]", canary)
    page.fill("#start-rollout input[name=wave_size]", wave_size)
    page.fill("#start-rollout input[name=deadline_s]", str(int(WAIT_S)))
    page.fill("#start-rollout input[name=rate_per_minute]", rate)
    page.click("#start-rollout button[type=submit]")
    page.wait_for_url(url + f"/rollouts/tiny-{version}")


def _halt_mid_wave(page, url, api) -> None:
    """The canary took v2 (a quiet probation passes); the next wave starts, its devices released 3 a minute:
    halted from the page once one of them took v2 and before the next is released."""

    def rollout():
        return api.get("/api/v1/rollouts/tiny-2").json()

    def wave_under_way():  # a device of the wave took v2, like the canary; the next not released yet
        devs = (rollout().get("progress") or {}).get("devices") or []
        took = [d for d in devs if d["wave"] == 1 and d["result"] in ("not_judged", "succeeded")]
        return took and sum(d["result"] == "in_progress" for d in devs) >= 1 and took

    _wait(wave_under_way, "a device of tiny-2's next wave to take v2", rollout)
    page.reload()
    page.click("#halt")
    page.wait_for_load_state()
    assert page.inner_text("#halted") == "yes"
    halted = rollout()
    assert halted["halted"] and halted["phase"] == "running", halted
    wave = halted["progress"]["cohorts"]["all"]["waves"][1]
    assert wave["started"] and wave["size"] == DEVICES - 1, wave  # mid-wave: started, far from done
    assert halted["progress"]["counts"].get("succeeded", 0) < DEVICES - 1, halted["progress"]["counts"]


def _wait(check, what: str, rollout):
    try:
        return wait_for(check, WAIT_S, what, step=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {json.dumps(rollout())[:6000]}") from None


def _roll_back(page, url, api) -> None:
    page.click("#rollback-btn")
    page.wait_for_load_state()

    def rolled_back():
        r = api.get("/api/v1/rollouts/tiny-2").json()
        rb = (r.get("progress") or {}).get("rollback") or {}
        return r["phase"] == "finished" and rb.get("state") not in (None, "running") and r

    done = wait_for(rolled_back, WAIT_S, "tiny-2 rolled back", step=0.5)
    rb = done["progress"]["rollback"]
    assert done["state"] == "halted" and not rb.get("remaining"), rb
    took = [d["device_id"] for d in done["progress"]["devices"] if d["result"] == "rolled_back"]
    assert len(took) >= 2, done["progress"]["devices"]  # the canary and a device of the halted wave went back
    wait_for(lambda: _on(api, "1"), WAIT_S, "every device back on tiny 1, committed", step=0.5)
    page.reload()
    assert page.inner_text("#state") == "halted" and page.inner_text("#halted") == "yes"
    assert "rolled_back" in page.inner_text("#rollout-devices")


def _matrix(page, url, api, targets) -> None:
    """Both hardware classes in the matrix with the provider their devices chose for tiny 1 (their own records)."""

    def cells():
        m = api.get("/api/v1/evidence").json()
        row = next((r for r in m["rows"] if (r["model"], r["version"]) == ("tiny", "1")), None)
        full = row and all((row["cells"].get(c) or {}).get("devices") == DEVICES // 2 for c in targets)
        return full and row["cells"]

    got = wait_for(cells, WAIT_S, "every device's decision record of tiny 1 in the matrix", step=0.5)
    page.goto(url + "/evidence")
    text = page.inner_text("#matrix")
    for cls in targets:
        assert cls in text, text
        for choice in got[cls]["choices"]:
            assert choice["provider"] and f"{choice['provider']} {choice['precision']}" in text, (cls, choice, text)
    assert page.locator("#matrix a[href^='/evidence/cell']").count() >= len(targets)


def _charts(page, url, api, target) -> None:
    """The class's charts drawn from its devices' health messages: every figure the API has measured points of
    (at least 3, of at least one figure) is a chart with a dot per point."""
    keys = ("cpu_percent", "temp_max_c", "mem_used_percent", "rss_mib", "disk_used_percent", "throttled")

    def measured():
        pts = api.get("/api/v1/telemetry", params={"target": target}).json()["health"]
        got = {k: sum(p.get(k) is not None for p in pts) for k in keys}
        return any(n >= 3 for n in got.values()) and got

    got = wait_for(measured, WAIT_S, f"3 measured health points of {target}", step=0.5)
    assert got["cpu_percent"] == 0, got  # a simulated device's figures come from its capture, not from this host
    page.goto(url + f"/charts?target={target}")
    drawn = 0
    for key in keys:
        svg = page.locator(f"#chart-{key} svg")
        if not svg.count():
            assert "not measured" in page.inner_text(f"#chart-{key}"), key
            continue
        n = int(svg.get_attribute("data-points"))
        assert n >= 1 and page.locator(f"#chart-{key} circle.pt").count() == n, key
        box = svg.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 100  # laid out, not an empty element
        drawn += n >= 3
    assert drawn >= 1


def _alert(page, url, api, hook) -> None:
    key = "rollout_halted:tiny-2"
    sent = wait_for(lambda: [d for d in list(hook.got) if d["key"] == key], WAIT_S, "the halt's webhook", step=0.5)
    assert sent[0]["event"] == "alert.raised" and "tiny-2" in sent[0]["message"], sent
    page.goto(url + "/alerts")
    assert "rollout tiny-2 halted" in page.inner_text("#alerts")
    assert int(page.inner_text("b.count")) >= 1  # the header's count
