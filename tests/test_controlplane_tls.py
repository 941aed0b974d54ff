"""The control plane over HTTPS: a self-signed certificate made here (cryptography), the real service started
with it in its config (tls.certfile, tls.keyfile: uvicorn's ssl_certfile/ssl_keyfile), called with httpx
verifying against that certificate and by the CLI (SSL_CERT_FILE); session cookies are Secure and `__Host-`
prefixed, HSTS is sent; plain HTTP beyond loopback is refused unless listen.allow_insecure says a TLS proxy is in
front; the shipped systemd config serves TLS."""

from __future__ import annotations

import datetime
import ipaddress
import re
import ssl
from pathlib import Path

import httpx
import pytest
from clirunner import edge_agent
from cp_support import running_service

from agent.artifacts.keys import device_key
from agent.controlplane.service import ControlPlane, check_tls, server
from agent.controlplane.settings import load, parse
from agent.errors import ConfigError
from agent.transport.cpclient import enroll_request

ROOT = Path(__file__).resolve().parent.parent


def self_signed(tmp: Path, name: str = "cp") -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    tmp.mkdir(parents=True, exist_ok=True)
    crt, pem = tmp / f"{name}.crt", tmp / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pem.chmod(0o600)
    return crt, pem


def test_the_service_over_tls(tmp_path):
    crt, pem = self_signed(tmp_path / "tls")
    trust = ssl.create_default_context(cafile=str(crt))
    with running_service(tmp_path, tls={"certfile": str(crt), "keyfile": str(pem)}) as (cp, url):
        assert url.startswith("https://127.0.0.1:")
        api = httpx.Client(base_url=url, verify=trust, headers={"Authorization": f"Bearer {cp.admin_token}"})
        r = api.get("/api/v1/health")
        assert r.status_code == 200 and r.json()["ok"] is True
        assert r.headers["strict-transport-security"] == "max-age=31536000"
        r = api.post("/api/v1/enroll", json=enroll_request("dev-1", device_key(tmp_path / "keys" / "dev-1")))
        assert r.status_code == 202, r.text
        with pytest.raises(httpx.ConnectError):  # a client that does not trust this certificate
            httpx.get(url + "/api/v1/health")
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
            httpx.get(url.replace("https://", "http://") + "/api/v1/health", timeout=10)

        # the dashboard over TLS: the sign-in and session cookies are Secure, __Host- prefixed, HttpOnly, Strict
        c = httpx.Client(base_url=url, verify=trust)
        r = c.get("/login")
        assert re.search(r"__Host-eacp_login=[^;]+;.*Secure", r.headers["set-cookie"], re.I), r.headers["set-cookie"]
        nonce = re.search(r'name="csrf" value="([^"]+)"', r.text).group(1)
        r = c.post("/login", data={"token": cp.admin_token, "csrf": nonce, "next": "/pending"}, headers={"Origin": url})
        assert r.status_code == 303 and r.headers["location"] == "/pending", r.text
        cookie = [v for k, v in r.headers.multi_items() if k == "set-cookie" and "eacp_session" in v][0]
        assert cookie.startswith("__Host-eacp_session=") and "Secure" in cookie and "HttpOnly" in cookie
        assert "Path=/" in cookie and "Domain" not in cookie
        page = c.get("/pending")
        assert page.status_code == 200 and "dev-1" in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        plain_origin = url.replace("https://", "http://")  # the same host and port over plain HTTP: another origin
        r = c.post("/devices/dev-1/accept", data={"csrf": csrf}, headers={"Origin": plain_origin})
        assert r.status_code == 403 and api.get("/api/v1/devices/dev-1").json()["state"] == "pending"
        r = c.post("/devices/dev-1/accept", data={"csrf": csrf, "groups": "lab"}, headers={"Origin": url})
        assert r.status_code == 303 and api.get("/api/v1/devices/dev-1").json()["state"] == "accepted"

        # the CLI trusts the certificate through SSL_CERT_FILE (OpenSSL's own variable)
        (tmp_path / "admin.token").write_text(cp.admin_token)
        args = ("fleet", "status", "--control-plane", url, "--token-file", tmp_path / "admin.token", "--json")
        out = edge_agent(*args, env={"SSL_CERT_FILE": str(crt)})
        assert out.returncode == 0 and "dev-1" in out.stdout, out.stderr
        out = edge_agent(*args)
        assert out.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in out.stderr, out.stderr


def test_plain_http_beyond_loopback_is_refused_unless_said(tmp_path):
    crt, pem = self_signed(tmp_path / "tls")
    for host in ("0.0.0.0", "::", "192.0.2.7", "cp.example"):
        with pytest.raises(ConfigError, match="listen.host: .*tls.certfile and tls.keyfile.*allow_insecure"):
            parse({"listen": {"host": host}}, tmp_path)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert parse({"listen": {"host": host}}, tmp_path).scheme == "http"
    s = parse({"listen": {"host": "0.0.0.0", "allow_insecure": True}}, tmp_path)
    assert s.allow_insecure and s.scheme == "http"
    s = parse({"listen": {"host": "0.0.0.0"}, "tls": {"certfile": "tls/cp.crt", "keyfile": "tls/cp.key"}}, tmp_path)
    assert s.scheme == "https" and s.tls_certfile == crt and s.tls_keyfile == pem
    check_tls(s)
    for doc, key in (
        ({"tls": {"certfile": str(crt)}}, "tls: give both"),
        ({"tls": {"certfile": str(crt), "keyfile": str(pem), "ca": "x"}}, "tls.ca: unknown key"),
        ({"tls": "cp.crt"}, "tls: expected a mapping"),
        ({"listen": {"allow_insecure": "yes"}}, "listen.allow_insecure: expected true or false"),
    ):
        with pytest.raises(ConfigError, match=key):
            parse(doc, tmp_path)
    other_crt, other_key = self_signed(tmp_path / "other")
    for tls, key in (
        ({"certfile": str(crt), "keyfile": str(other_key)}, "tls.certfile: .* with tls.keyfile"),  # not its key
        ({"certfile": str(tmp_path / "missing.crt"), "keyfile": str(pem)}, "tls.certfile: .* missing"),
        ({"certfile": str(pem), "keyfile": str(pem)}, "tls.certfile"),  # a key is not a certificate
    ):
        settings = parse({"store": str(tmp_path / "store"), "tls": tls}, tmp_path)
        with pytest.raises(ConfigError, match=key):
            server(ControlPlane(settings))


def test_the_cli_refuses_plain_http_beyond_loopback(tmp_path):
    cfg = tmp_path / "cp.yaml"
    cfg.write_text("listen: {host: 0.0.0.0, port: 8470}\nstore: store\n")
    out = edge_agent("control-plane", "--config", cfg, timeout=60)
    assert out.returncode != 0 and "listen.host: 0.0.0.0" in out.stderr and "allow_insecure" in out.stderr
    cfg.write_text("listen: {host: 0.0.0.0, port: 8470}\nstore: store\ntls: {certfile: no.crt, keyfile: no.key}\n")
    out = edge_agent("control-plane", "--config", cfg, timeout=60)
    assert out.returncode == 2 and f"tls.certfile: {tmp_path / 'no.crt'} is missing" in out.stderr, out.stderr
    assert not (tmp_path / "control-plane.db").exists()  # refused before the database was made


def test_the_shipped_configs_serve_tls(tmp_path):
    s = load(ROOT / "systemd" / "control-plane.yaml")
    assert s.host == "0.0.0.0" and s.scheme == "https" and not s.allow_insecure
    assert s.tls_certfile == Path("/etc/edge-agent/tls/control-plane.crt")
    assert s.tls_keyfile == Path("/etc/edge-agent/tls/control-plane.key")
    container = (ROOT / "Containerfile").read_text()
    assert "/etc/edge-agent/tls" in container and "https://" in container


def test_behind_a_tls_proxy_on_this_host(tmp_path):
    """A proxy on loopback terminating TLS (X-Forwarded-Proto: https, the original Host): the service sees https
    (Secure __Host- cookies, HSTS) and takes the browser's https Origin as its own; without the header it is
    plain HTTP and that Origin is another one."""
    with running_service(tmp_path) as (cp, url):
        port = url.rsplit(":", 1)[1]
        public = f"https://127.0.0.1:{port}"
        proxied = {"X-Forwarded-Proto": "https"}
        c = httpx.Client(base_url=url, headers=proxied)
        r = c.get("/login")
        assert r.headers["strict-transport-security"] and "__Host-eacp_login" in r.headers["set-cookie"]
        nonce = re.search(r'name="csrf" value="([^"]+)"', r.text).group(1)
        c.cookies.set("__Host-eacp_login", nonce)  # httpx keeps Secure cookies for https URLs only
        r = c.post("/login", data={"token": cp.admin_token, "csrf": nonce}, headers={"Origin": public})
        assert r.status_code == 303 and r.headers["location"] == "/", r.text
        assert "__Host-eacp_session=" in r.headers["set-cookie"] and "Secure" in r.headers["set-cookie"]
        r = httpx.post(url + "/logout", headers={"Origin": public})  # not proxied: https is another origin
        assert r.status_code == 403 and "origin: refused" in r.text
