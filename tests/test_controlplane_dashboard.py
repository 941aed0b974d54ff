"""The dashboard's upload, device filters, audit page and self-refresh in a real browser (Playwright driving
Debian's chromium) against the real service on a real SQLite database, with devices whose verified statuses go
through the fleet loop's own intake (no broker) and whose signed decision records go through the API:

- a package uploaded from the browser with its progress shown (upload.js: XMLHttpRequest upload events), then
  its rollout started from the version's page; the same upload without JavaScript (a plain form post);
- a file over max_body_bytes refused before a byte is sent (with JavaScript) and with 413 by the service
  (without), nothing stored; a package that does not load refused with the findings of `package --check`;
- the device list filtered and grouped by model version, precision, provider and health, with the "why" of each
  model; the overview's precision; the device page's why; pages that refresh by themselves keeping their filters;
- the audit page, paged and filtered by actor and action, admins only;
- hostile input: markup in an uploaded file's name, in filter parameters and in paths shown as text (with the
  CSP bypassed, so the escaping alone holds), and a cross-origin post of the upload form refused (403), as is one
  without the form's CSRF token, nothing stored.

Screenshots (a version's page after its upload, a refused upload, the devices grouped by health, the audit page)
go to $EDGE_AGENT_ARTIFACTS/control-plane/ (default test-artifacts/control-plane/)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from cp_support import artifacts_dir, chromium, need_chromium, running_service, tiny_tarball
from test_controlplane_browser_attacks import Attacker

from agent.artifacts.keys import device_key, public_pem
from agent.transport.signing import sign_doc

MAX_BODY = 256 * 1024
MARKUP = "<img src=x onerror=window.__pwned=1>"
# device: (version, precision, provider, hardware class, model state, online)
FLEET = {
    "d-1": ("1", "f32", "cpu", "amd-epyc-x86", "committed", True),
    "d-2": ("2", "int8", "cpu", "amd-epyc-x86", "committed", True),
    "d-3": ("2", "int8", "openvino", "intel-xeon", "probation", True),
    "d-4": ("1", "f32", "openvino", "intel-xeon", "unavailable", True),
    "d-5": ("2", "bf16", "openvino", "intel-xeon", "committed", False),
}

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    need_chromium()
    tmp = tmp_path_factory.mktemp("dash")
    with running_service(tmp, max_body_bytes=MAX_BODY) as (cp, url):
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        _fleet(cp, api, tmp)
        yield cp, url, api, tmp
        api.close()


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _status(dev: str, **change) -> dict:
    """A verified status of `dev` as FLEET has it, with `change` (version, precision, ...) applied."""
    fields = dict(zip(("version", "precision", "provider", "target", "state", "online"), FLEET[dev]))
    fields.update(change)
    model = {k: fields[k] for k in ("version", "provider", "precision", "state")}
    if fields["state"] == "unavailable":
        model["reason"] = "session creation failed: out of memory"
    return {
        "trust": "verified",
        "online": fields["online"],
        "ts": time.time(),
        "target": fields["target"],
        "providers": [fields["provider"]],
        "models": {"tiny": model},
    }


def _ingest(cp, statuses: dict[str, dict]) -> None:
    from agent.controlplane.fleetloop import FleetLoop

    FleetLoop(cp.factory, cp.settings)._ingest(statuses)


def _fleet(cp, api, tmp: Path) -> None:
    for dev, (version, precision, provider, *_rest) in FLEET.items():
        key = device_key(tmp / "keys" / dev)
        body = {"device_id": dev, "public_key": public_pem(key.public_key()), "groups": ["lab"]}
        assert api.post("/api/v1/devices", json=body).status_code == 201
        if dev in ("d-1", "d-2"):  # a decision record with its reason: the list's and the device page's "why"
            doc = {
                "device_id": dev,
                "model": "tiny",
                "version": version,
                "deployment_id": f"tiny-{version}-{dev}",
                "ts": time.time(),
                "decision": {
                    "selected": provider,
                    "selected_precision": precision,
                    "reason": f"{provider} {precision}: fastest that passed on {dev}",
                    "results": [],
                },
            }
            r = api.post(f"/api/v1/devices/{dev}/decisions", json=sign_doc(doc, key))
            assert r.status_code == 201, r.text
    _ingest(cp, {dev: _status(dev) for dev in FLEET})


def _sign_in(page, url: str, token: str) -> None:
    page.goto(url + "/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")


def _package(tmp: Path, version: str) -> Path:
    return tiny_tarball(tmp, version, size=2048)


def _versions(api) -> list[tuple[str, str]]:
    return [(m["name"], m["version"]) for m in api.get("/api/v1/models").json()["models"]]


def _uploads(api) -> list[dict]:
    return api.get("/api/v1/audit", params={"action": "model.upload"}).json()["entries"]


def test_upload_with_progress_then_start_its_rollout(service, browser):
    cp, url, api, tmp = service
    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    seen: list[str] = []
    page.expose_function("seenUpload", lambda text: seen.append(text))
    page.goto(url + "/models")
    page.evaluate(
        """() => { const s = document.getElementById('upload-status'), b = document.getElementById('upload-progress');
        new MutationObserver(() => window.seenUpload(s.textContent + ' | ' + b.value + '/' + b.max))
          .observe(document.getElementById('upload'), {subtree: true, childList: true, characterData: true,
                                                         attributes: true}); }"""
    )
    page.set_input_files("input[name=package]", str(_package(tmp, "1")))
    page.fill("input[name=name]", "tiny")
    page.fill("input[name=version]", "1")
    page.click("#upload button[type=submit]")
    page.wait_for_url(url + "/models/tiny/1")
    size = (tmp / "tiny-1.tar.gz").stat().st_size
    assert any("(100%)" in s for s in seen), seen  # the progress as the browser reported it
    bars = [s.rsplit(" | ", 1)[1].split("/") for s in seen]
    assert any(a == b and float(a) > size for a, b in bars), seen  # the bar full: the whole multipart body sent
    assert "package --check: ok" in page.inner_text("#checked")
    page.screenshot(path=str(artifacts_dir() / "model-version.png"), full_page=True)
    assert ("tiny", "1") in _versions(api)
    # its rollout, started from the version's page
    page.select_option("#start-rollout select[name=group]", "lab")
    page.select_option("#start-rollout select[name=cohort_by]", "target")
    page.fill("#start-rollout input[name=canary]", "1")
    page.fill("#start-rollout input[name=wave_size]", "50%")
    page.click("#start-rollout button[type=submit]")
    page.wait_for_url(url + "/rollouts/tiny-1")
    r = api.get("/api/v1/rollouts/tiny-1").json()
    assert (r["spec"]["group"], r["spec"]["cohort_by"], r["spec"]["canary"], r["spec"]["wave_size"]) == (
        "lab",
        "target",
        "1",
        "50%",
    )
    assert r["created_by"] == "operator:admin"
    page.goto(url + "/models/tiny/1")
    assert "tiny-1" in page.inner_text("#rollout-link")
    ctx.close()

    # without JavaScript: the same form, a plain post, the same checks
    ctx = browser.new_context(java_script_enabled=False)
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    page.goto(url + "/models")
    page.set_input_files("input[name=package]", str(_package(tmp, "2")))
    page.fill("input[name=name]", "tiny")
    page.fill("input[name=version]", "2")
    page.click("#upload button[type=submit]")
    page.wait_for_url(url + "/models/tiny/2")
    assert ("tiny", "2") in _versions(api)
    ctx.close()


def test_oversized_and_broken_uploads_are_refused_and_nothing_stored(service, browser):
    cp, url, api, tmp = service
    big = tmp / "big.onnx"
    big.write_bytes(os.urandom(MAX_BODY + 4096))
    broken = tmp / "broken.onnx"
    broken.write_bytes(b"not an onnx model" * 10)
    before, audited = _versions(api), len(_uploads(api))
    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    page.goto(url + "/models")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.set_input_files("input[name=package]", str(big))
    page.fill("input[name=name]", "big")
    page.fill("input[name=version]", "1")
    page.click("#upload button[type=submit]")
    page.wait_for_function("() => document.getElementById('upload-status').textContent.includes('refused')")
    assert "refused before sending" in page.inner_text("#upload-status") and posts == []
    # a package that does not load: refused with the findings of package --check, shown in place
    page.set_input_files("input[name=package]", str(broken))
    page.fill("input[name=version]", "2")
    page.check("input[name=store_anyway]")
    with page.expect_response(lambda r: r.url == url + "/models/upload") as answer:
        page.click("#upload button[type=submit]")
    assert answer.value.status == 422
    page.wait_for_selector("#upload-refused")
    assert "does not load" in page.inner_text("#upload-refused") and page.locator("#findings li").count() >= 1
    page.screenshot(path=str(artifacts_dir() / "upload-refused.png"), full_page=True)
    ctx.close()
    # without JavaScript the service refuses it: 413, before the route reads it
    ctx = browser.new_context(java_script_enabled=False)
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    page.goto(url + "/models")
    page.set_input_files("input[name=package]", str(big))
    page.fill("input[name=name]", "big")
    page.fill("input[name=version]", "1")
    with page.expect_response(lambda r: r.url == url + "/models/upload") as answer:
        page.click("#upload button[type=submit]")
    assert answer.value.status == 413
    page.wait_for_load_state()
    assert "max_body_bytes" in page.inner_text("#error")
    ctx.close()
    assert _versions(api) == before and len(_uploads(api)) == audited


def test_device_filters_groups_why_and_refresh(service, browser):
    cp, url, api, tmp = service
    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)

    def listed(query: str) -> list[str]:
        page.goto(url + "/devices?" + query)
        return page.locator("#devices td:first-child a").all_inner_texts()

    assert listed("model=tiny&version=2") == ["d-2", "d-3", "d-5"]
    assert listed("precision=int8") == ["d-2", "d-3"]
    assert listed("provider=openvino&version=1") == ["d-4"]
    assert listed("health=degraded") == ["d-4"]
    assert "session creation failed" in page.inner_text("#devices")
    assert listed("health=on+probation") == ["d-3"]
    assert listed("health=offline") == ["d-5"]
    assert listed("health=healthy") == ["d-1", "d-2"]
    assert listed("state=&group=lab&target=intel-xeon") == ["d-3", "d-4", "d-5"]
    # grouped: a count per value over every device the filters leave, each linking to its devices
    assert listed("group_by=precision") == ["d-5", "d-1", "d-4", "d-2", "d-3"]  # bf16, f32, int8
    groups = dict(r.split("\t") for r in page.locator("#device-groups tr").all_inner_texts()[1:])
    assert groups == {"bf16": "1", "f32": "2", "int8": "2"}
    page.click("#device-groups a:text('int8')")
    page.wait_for_url("**/devices?*precision=int8*")
    assert page.locator("#devices td:first-child a").all_inner_texts() == ["d-2", "d-3"]
    listed("group_by=health")
    page.screenshot(path=str(artifacts_dir() / "devices-by-health.png"), full_page=True)
    groups = dict(r.split("\t") for r in page.locator("#device-groups tr").all_inner_texts()[1:])
    assert groups == {"degraded": "1", "healthy": "2", "offline": "1", "on probation": "1"}
    # the why of each model, on the list and on the device page, without a click; a missing one in words
    listed("")
    text = page.inner_text("#devices")
    assert "why: cpu f32: fastest that passed on d-1" in text and "why: cpu int8: fastest that passed on d-2" in text
    assert "why: not recorded" in text and "None" not in text
    page.goto(url + "/devices/d-2")
    assert "fastest that passed on d-2" in page.inner_text("#models")
    page.goto(url + "/devices/d-4")
    assert "not recorded" in page.inner_text("#models") and "None" not in page.inner_text("main")
    # the overview shows precision
    page.goto(url + "/")
    cohorts = page.inner_text("#cohorts")
    assert "precision" in cohorts and "int8" in cohorts and "bf16" in cohorts and "None" not in cohorts
    # refreshes by itself, keeping its filters: d-1 moves to int8 and appears in the filtered list
    page.goto(url + "/devices?precision=int8&group=lab")
    page.wait_for_function("() => document.querySelector('main').dataset.refresh === '15'")
    _ingest(cp, {"d-1": _status("d-1", precision="int8", version="2")})
    page.wait_for_function(
        "() => [...document.querySelectorAll('#devices td:first-child a')].map(a => a.textContent).join() == "
        "'d-1,d-2,d-3'",
        timeout=40_000,
    )
    assert page.url == url + "/devices?precision=int8&group=lab"
    assert int(page.get_attribute("main", "data-refreshed") or 0) >= 1
    _ingest(cp, {"d-1": _status("d-1")})
    # the overview too
    page.goto(url + "/")
    _ingest(cp, {"d-5": _status("d-5", precision="fp16")})
    page.wait_for_function("() => document.getElementById('cohorts').textContent.includes('fp16')", timeout=30_000)
    ctx.close()


def test_audit_page_paged_filtered_admin_only(service, browser):
    cp, url, api, tmp = service
    for i in range(55):  # 55 audited group changes: two pages of them
        assert api.put("/api/v1/devices/d-5/groups", json={"groups": ["lab", f"g{i % 3}"]}).status_code == 200
    viewer = api.post("/api/v1/tokens", json={"name": "watcher", "role": "viewer"}).json()["token"]
    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    page.goto(url + "/audit?action=device.groups")
    assert page.locator("#audit tr").count() == 51  # a page of 50 and the header
    assert "55 entries, page 1 of 2" in page.inner_text("#audit-count")
    page.screenshot(path=str(artifacts_dir() / "audit.png"), full_page=True)
    page.click("a:text('next')")
    page.wait_for_url("**page=1*")
    assert page.locator("#audit tr").count() == 6 and "action=device.groups" in page.url
    page.goto(url + "/audit?actor=operator:&action=token.")
    rows = page.locator("#audit tr").all_inner_texts()[1:]
    assert len(rows) == 1 and "watcher" in rows[0] and "viewer" in rows[0]
    ctx.close()
    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, viewer)
    resp = page.goto(url + "/audit")
    assert resp is not None and resp.status == 403 and "needs admin" in page.inner_text("#error")
    assert page.locator("header a:text('Audit')").count() == 0
    ctx.close()


def test_hostile_names_params_paths_and_cross_origin_upload(service, browser):
    cp, url, api, tmp = service
    before, audited = _versions(api), len(_uploads(api))
    ctx = browser.new_context(bypass_csp=True)  # the escaping alone must hold
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    page.goto(url + "/models")
    page.set_input_files(
        "input[name=package]",
        {"name": MARKUP + ".onnx", "mimeType": "application/octet-stream", "buffer": b"not a model"},
    )
    page.fill("input[name=name]", "evil")
    page.fill("input[name=version]", "1")
    page.click("#upload button[type=submit]")
    page.wait_for_selector("#upload-refused")
    assert MARKUP in page.inner_text("#upload-refused")  # shown as text
    for path in (
        "/devices?" + "&".join(f"{k}={quote(MARKUP)}" for k in ("group", "target", "model", "precision", "health")),
        "/devices?group_by=" + quote(MARKUP) + "&provider=" + quote('"><' + MARKUP[1:]),
        "/audit?actor=" + quote(MARKUP) + "&action=" + quote(MARKUP),
        "/models/" + quote(MARKUP, safe="") + "/1",
        "/devices/" + quote(MARKUP, safe=""),
    ):
        resp = page.goto(url + path)
        assert resp is not None and resp.status < 500, (path, resp and resp.status)
        page.wait_for_timeout(200)  # an onerror handler would have run by now
        assert not page.evaluate("() => window.__pwned === 1"), path
        assert page.locator("main img").count() == 0, path
    page.goto(url + "/devices?model=" + quote(MARKUP))
    assert page.input_value("input[name=model]") == MARKUP
    ctx.close()

    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    with Attacker() as atk:  # another origin on this host auto-posts the upload form, a file set by script
        atk.pages["/upload.html"] = (
            f'<!doctype html><form id="f" method="post" action="{url}/models/upload" enctype="multipart/form-data">'
            '<input name="name" value="pwn"><input name="version" value="1"><input name="store_anyway" value="yes">'
            '<input type="file" name="package"></form><script>const dt = new DataTransfer();'
            "dt.items.add(new File(['not a model'], 'm.onnx'));const f = document.getElementById('f');"
            "f.package.files = dt.files; f.submit()</script>"
        )
        with page.expect_response(lambda r: r.url == url + "/models/upload") as answer:
            page.goto(atk.url + "/upload.html")
        resp = answer.value
        assert resp.status == 403 and resp.request.all_headers().get("origin") == atk.url
        assert "eacp_session=" in resp.request.all_headers().get("cookie", "")  # same site: the cookie went along
    # same origin but without the form's CSRF token (the session's cookie, no Origin header): 403
    r = page.request.post(
        url + "/models/upload",
        multipart={
            "name": "pwn",
            "version": "1",
            "store_anyway": "yes",
            "package": {
                "name": "m.onnx",
                "mimeType": "application/octet-stream",
                "buffer": _package(tmp, "3").read_bytes(),
            },
        },
    )
    assert r.status == 403 and "csrf" in r.text()
    ctx.close()
    assert _versions(api) == before and len(_uploads(api)) == audited
    assert not [p for p in (tmp / "store").glob("tmp*")]  # no staging left behind


def test_no_page_prints_none(service, browser):
    """Missing values in what a device sent (a reason, a figure, a trial's field, a report's summary) print in
    words ("not recorded", JSON's null inside a mapping), never Python's `None`, on every page."""
    import re

    cp, url, api, tmp = service
    key = device_key(tmp / "keys" / "d-5")
    row = {
        "provider": "openvino",
        "precision": "bf16",
        "status": "failed",
        "reason": None,
        "conditions": {"load": None},
    }
    doc = {
        "device_id": "d-5",
        "model": "tiny",
        "version": "2",
        "deployment_id": "tiny-2-d-5",
        "ts": time.time(),
        "decision": {"selected": None, "reason": None, "results": [row]},
        "trial": {"verdict": None, "shadow": {"p50": None}},
    }
    assert api.post("/api/v1/devices/d-5/decisions", json=sign_doc(doc, key)).status_code == 201
    report = {"device_id": "d-5", "model": "tiny", "version": "2", "ts": time.time(), "summary": {"failed": None}}
    assert api.post("/api/v1/devices/d-5/conformance", json=sign_doc(report, key)).status_code == 201
    ctx = browser.new_context()
    page = ctx.new_page()
    _sign_in(page, url, cp.admin_token)
    for path in (
        "/",
        "/devices",
        "/devices?group_by=model",
        "/devices/d-5",
        "/devices/d-4",
        "/models",
        "/rollouts",
        "/audit",
        "/pending",
    ):
        page.goto(url + path)
        text = page.inner_text("main")
        assert not re.search(r"\bNone\b", text), (path, text[:2000])
    page.goto(url + "/devices/d-5")
    assert "Why: not recorded" in page.inner_text("main")
    ctx.close()


def test_push_a_version_to_a_hardware_class_from_its_page(tmp_path, browser):
    """The version page's push: every accepted device of a hardware class gets the signed desired state, retained
    on a real Mosquitto (read back by a subscriber), and no other device; a form without a target, or with a
    device id carrying markup, pushes nothing and says why as text."""
    from brokers import Mosquitto

    from agent.artifacts.keys import generate
    from agent.transport.mqtt import BrokerConfig, MqttLink

    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, _, _ = generate(tmp_path / "fleet-keys")
        doc = {"mqtt": {"url": broker.url}, "signing_key": str(key)}
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
            _fleet(cp, api, tmp_path)
            body = _package(tmp_path, "1").read_bytes()
            assert api.put("/api/v1/models/tiny/versions/1", content=body).status_code == 201
            ctx = browser.new_context()
            page = ctx.new_page()
            _sign_in(page, url, cp.admin_token)
            page.goto(url + "/models/tiny/1")
            page.click("#push button[type=submit]")  # no target chosen
            assert "not pushed: targets:" in page.inner_text("#push-result")
            svg = "<svg/onload=window.__pwned=1>"  # one word: the ids are split at commas and spaces
            page.fill("#push input[name=devices]", svg)
            page.click("#push button[type=submit]")
            assert f"{svg!r} is not a device id" in page.inner_text("#push-result")
            assert page.locator("main svg").count() == 0 and not page.evaluate("() => window.__pwned === 1")
            page.select_option("#push select[name=target]", "intel-xeon")
            page.click("#push button[type=submit]")
            page.wait_for_url(url + "/models/tiny/1")
            notice = page.inner_text("#push-result")
            assert notice == "pushed tiny 1 to hardware class intel-xeon (3 devices): d-3, d-4, d-5", notice
            ctx.close()
            seen: dict[str, bytes] = {}
            link = MqttLink(BrokerConfig(broker.url)).start()
            try:
                link.subscribe(f"{cp.settings.prefix}/devices/+/desired/tiny", lambda t, p, r: seen.update({t: p}))
                link.wait_subscribed(5)
                time.sleep(0.5)  # the retained messages arrive right after the subscription
            finally:
                link.stop()
            assert sorted(t.split("/")[-3] for t, p in seen.items() if p) == ["d-3", "d-4", "d-5"]
            pushes = api.get("/api/v1/audit", params={"action": "model.push"}).json()["entries"]
            assert [e["detail"]["devices"] for e in pushes] == [["d-3", "d-4", "d-5"]]
            api.close()
