"""The dashboard's browser protections over a real socket (a real service, httpx, a real SQLite database): the
headers on every answer, markup in URLs rendered escaped (error pages included), the sign-in page's `next`
refusing every open-redirect form, CSRF refusals (no token, a wrong token, a foreign Origin, Sec-Fetch-Site
cross-site or same-site, Origin null) with nothing stored, and the JSON API taking no authority from the
session cookie. The same attacks in Chromium: tests/test_controlplane_browser_attacks.py."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from cp_support import running_service

from agent.artifacts.keys import device_key
from agent.controlplane.security import CSP
from agent.transport.cpclient import enroll_request

TEMPLATES = Path(__file__).resolve().parent.parent / "agent" / "controlplane" / "templates"
MARKUP = "<svg onload=window.__pwned=1>"  # no "/": a path segment
IMG = '<img src=x onerror="window.__pwned=1">'


@pytest.fixture
def svc(tmp_path):
    with running_service(tmp_path) as (cp, url):
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        r = api.post("/api/v1/enroll", json=enroll_request("dev-1", device_key(tmp_path / "keys" / "dev-1")))
        assert r.status_code == 202 and r.json()["state"] == "pending", r.text
        yield cp, url, api
        api.close()


def hidden_csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]*)"', html)
    assert m, html[:500]
    return m.group(1)


def signed_in(url: str, token: str) -> tuple[httpx.Client, str]:
    """A browser-like client signed in through the form; (client, the session's CSRF token)."""
    c = httpx.Client(base_url=url, timeout=30)
    nonce = hidden_csrf(c.get("/login").text)
    r = c.post("/login", data={"token": token, "next": "/pending", "csrf": nonce})
    assert r.status_code == 303 and r.headers["location"] == "/pending", r.text
    page = c.get("/pending")
    assert page.status_code == 200 and "dev-1" in page.text
    return c, hidden_csrf(page.text)


def state(api: httpx.Client, dev: str = "dev-1") -> str:
    return api.get(f"/api/v1/devices/{dev}").json()["state"]


def audited(api: httpx.Client, action: str) -> list:
    return [a for a in api.get("/api/v1/audit", params={"limit": 1000}).json()["entries"] if a["action"] == action]


def test_every_answer_carries_the_headers(svc):
    cp, url, api = svc
    answers = {
        "login page": httpx.get(url + "/login"),
        "redirect to login": httpx.get(url + "/rollouts"),
        "api": api.get("/api/v1/devices"),
        "api 401": httpx.get(url + "/api/v1/devices"),
        "static": httpx.get(url + "/static/cp.css"),
        "unknown path": httpx.get(url + "/nope"),
        "origin refusal": httpx.post(url + "/logout", headers={"Origin": "http://evil.example"}),
        "schema": httpx.get(url + "/api/openapi.json"),
    }
    for name, r in answers.items():
        h = r.headers
        assert h["content-security-policy"] == CSP, name
        assert h["x-content-type-options"] == "nosniff" and h["referrer-policy"] == "same-origin", name
        assert h["x-frame-options"] == "DENY" and "strict-transport-security" not in h, name  # plain HTTP here
    for part in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "form-action 'self'"):
        assert part in CSP
    assert "base-uri 'none'" in CSP and "unsafe-inline" not in CSP
    assert answers["login page"].headers["cache-control"] == "no-store"


def test_templates_have_no_inline_script_or_style():
    """The CSP allows no inline script and no inline style: the templates must not need any (a script is a file
    of /static/, loaded by `<script src=... defer></script>` with nothing between the tags)."""
    inline = r"<script(?!\s+src=\"/static/[a-z]+\.js\"\s+defer></script>)"
    for path in TEMPLATES.glob("*.html"):
        text = path.read_text()
        for pattern in (inline, r"<style", r"\sstyle=", r"\son[a-z]+=", r"javascript:", r"\|\s*safe\b"):
            assert not re.search(pattern, text, re.I), (path.name, pattern)
    for script in (TEMPLATES.parent / "static").glob("*.js"):  # no markup built from strings, no eval
        text = script.read_text()
        for pattern in (
            r"innerHTML",
            r"outerHTML",
            r"insertAdjacentHTML",
            r"document\.write",
            r"\beval\(",
            r"Function\(",
        ):
            assert not re.search(pattern, text), (script.name, pattern)


def test_markup_in_urls_comes_back_escaped(svc):
    cp, url, api = svc
    c, csrf = signed_in(url, cp.admin_token)
    r = c.get("/rollouts/" + MARKUP)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert MARKUP not in r.text and "&lt;svg onload=window.__pwned=1&gt;" in r.text
    r = c.post(f"/devices/{IMG}/accept", data={"csrf": csrf})
    assert r.status_code == 400 and "<img" not in r.text and "&lt;img src=x onerror=" in r.text, r.text
    r = c.post(f"/devices/dev-1/{MARKUP}", data={"csrf": csrf})
    assert r.status_code == 404 and MARKUP not in r.text and "&lt;svg onload=" in r.text
    r = c.post(f"/rollouts/x/{MARKUP}", data={"csrf": csrf})
    assert r.status_code == 404 and MARKUP not in r.text
    # through the sign-in page: `next` is escaped in the form, and a planted error text is not shown at all
    r = httpx.get(url + "/login", params={"next": '/"><script>window.__pwned=1</script>', "error": MARKUP})
    assert r.status_code == 200 and "<script>" not in r.text and "<svg" not in r.text
    assert 'value="/&#34;&gt;&lt;script&gt;window.__pwned=1&lt;/script&gt;"' in r.text  # a path here, escaped
    r = c.get("/rollouts", params={"error": MARKUP})  # no message is taken from the URL
    assert r.status_code == 200 and "__pwned" not in r.text
    assert state(api) == "pending" and not audited(api, "token.create")[1:]  # only the first start's admin token


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example/",
        "/\\evil.example/",
        "\\\\evil.example",
        "https://evil.example/",
        "http:/evil.example",
        "javascript:alert(1)",
        "/\t/evil.example",
        "/\n/evil.example",
        "///evil.example",
        " /x",
        "evil.example",
        "",
    ],
)
def test_next_sends_only_to_this_service(svc, target):
    cp, url, api = svc
    c = httpx.Client(base_url=url, timeout=30)
    nonce = hidden_csrf(c.get("/login", params={"next": target}).text)
    r = c.post("/login", data={"token": cp.admin_token, "next": target, "csrf": nonce})
    assert r.status_code == 303 and r.headers["location"] == "/", (target, r.headers.get("location"))


def test_next_keeps_a_path_of_this_service(svc):
    cp, url, api = svc
    c = httpx.Client(base_url=url, timeout=30)
    r = c.get("/devices", params={"state": "pending"})
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fdevices"
    nonce = hidden_csrf(c.get("/login").text)
    r = c.post("/login", data={"token": cp.admin_token, "next": "/rollouts/tiny-2", "csrf": nonce})
    assert r.status_code == 303 and r.headers["location"] == "/rollouts/tiny-2"


def test_csrf_refusals_store_nothing(svc):
    cp, url, api = svc
    c, csrf = signed_in(url, cp.admin_token)
    port = int(url.rsplit(":", 1)[1])
    attempts = {
        "no token": ({}, {}),
        "wrong token": ({"csrf": csrf[:-2] + "xx"}, {}),
        "empty token": ({"csrf": ""}, {}),
        "other port": ({"csrf": csrf}, {"Origin": f"http://127.0.0.1:{port + 1}"}),
        "other host": ({"csrf": csrf}, {"Origin": "http://evil.example"}),
        "other scheme": ({"csrf": csrf}, {"Origin": f"https://127.0.0.1:{port}"}),
        "origin null": ({"csrf": csrf}, {"Origin": "null"}),
        "cross-site": ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
        "same-site": ({"csrf": csrf}, {"Sec-Fetch-Site": "same-site"}),
    }
    for name, (form, headers) in attempts.items():
        for path in ("/devices/dev-1/accept", "/rollouts", "/rollouts/x/halt", "/logout"):
            data = {**form, "groups": "lab", "model_version": "tiny 1"}
            r = c.post(path, data=data, headers=headers)
            assert r.status_code == 403, (name, path, r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("text/html") and ("csrf:" in r.text or "origin:" in r.text)
        assert state(api) == "pending", name
    assert not audited(api, "device.accept") and not audited(api, "rollout.start")
    assert c.get("/pending").status_code == 200  # /logout was refused each time: still signed in
    # the same form with its token, from this origin: accepted
    r = c.post("/devices/dev-1/accept", data={"csrf": csrf, "groups": "lab"}, headers={"Origin": url})
    assert r.status_code == 303 and state(api) == "accepted"
    assert [a["actor"] for a in audited(api, "device.accept")] == ["operator:admin"]


def test_sign_in_needs_its_form_and_this_origin(svc):
    cp, url, api = svc
    c = httpx.Client(base_url=url, timeout=30)
    r = c.post("/login", data={"token": cp.admin_token, "next": "/"})  # no nonce cookie, no field: login CSRF
    assert r.status_code == 303 and "error=form" in r.headers["location"] and not c.cookies
    nonce = hidden_csrf(c.get("/login").text)
    r = c.post("/login", data={"token": cp.admin_token, "csrf": nonce}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "eacp_session" not in c.cookies
    r = c.post("/login", data={"token": "eacp_wrong", "csrf": nonce})
    assert r.status_code == 303 and "error=token" in r.headers["location"] and "eacp_session" not in c.cookies
    r = c.post("/login", data={"token": cp.admin_token, "csrf": nonce})
    assert r.status_code == 303 and "eacp_session" in c.cookies
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Secure" not in cookie
    assert cp.admin_token not in cookie  # the cookie is a session id, never the operator token


def test_the_api_takes_no_authority_from_the_session_cookie(svc):
    cp, url, api = svc
    c, csrf = signed_in(url, cp.admin_token)
    assert c.get("/api/v1/devices").status_code == 401
    r = c.post("/api/v1/tokens", json={"name": "eve", "role": "admin"}, headers={"X-CSRF": csrf})
    assert r.status_code == 401
    r = c.post("/api/v1/devices/dev-1/accept", json={})
    assert r.status_code == 401 and state(api) == "pending"
    # a bearer token from a page of another origin is refused too (no browser-originated API call from elsewhere)
    h = {"Authorization": f"Bearer {cp.admin_token}", "Origin": "http://127.0.0.1:1"}
    assert httpx.post(url + "/api/v1/tokens", json={"name": "eve", "role": "admin"}, headers=h).status_code == 403
    assert [a["target"] for a in audited(api, "token.create")] == ["admin"]  # the first start's, nothing since
    # devices and the CLI (no Origin, no Sec-Fetch-Site) are unaffected
    assert api.post("/api/v1/tokens", json={"name": "ci", "role": "viewer"}).status_code == 201


def test_logout_ends_the_session(svc):
    cp, url, api = svc
    c, csrf = signed_in(url, cp.admin_token)
    old = dict(c.cookies)
    r = c.post("/logout", data={"csrf": csrf}, headers={"Origin": url})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    again = httpx.get(url + "/pending", cookies=old)  # the old cookie, replayed: the session is gone
    assert again.status_code == 303 and again.headers["location"].startswith("/login")


def test_an_unexpected_error_still_carries_the_headers(svc):
    """A fault no route expects (here a table dropped under the service): 500, JSON on the API and the error page
    on the dashboard, with the same headers as every other answer and nothing of the request echoed."""
    from sqlalchemy import text

    cp, url, api = svc
    with cp.engine.begin() as conn:
        conn.execute(text("DROP TABLE rollouts"))
    r = api.get("/api/v1/rollouts")
    assert r.status_code == 500 and r.json() == {"error": "internal error (logged by the service)"}
    assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    # a new connection: uvicorn closes the one an exception went through
    r = httpx.get(url + "/rollouts", params={"x": MARKUP}, headers={"Authorization": f"Bearer {cp.admin_token}"})
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/html") and "internal error" in r.text
    assert r.headers["content-security-policy"] == CSP and "svg" not in r.text
