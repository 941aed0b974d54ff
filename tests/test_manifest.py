"""Signed manifests: every rejection rule fires before a download, and a good manifest round-trips."""

import base64
import json

import pytest

from agent.artifacts import keys
from agent.artifacts.manifest import (
    Manifest,
    ManifestRejected,
    canonical_json,
    compare_versions,
    receive,
    rejection_record,
)
from agent.errors import ManifestError

NOW = 1_800_000_000
CHUNK = 1024


def make(version="2", devices=("pi-1",), groups=(), rollback=False, size=3000, ttl=3600, name="resnet", **kw):
    return Manifest.create(
        name=name,
        version=version,
        sha256="a" * 64,
        size=size,
        chunk_size=CHUNK,
        chunks=["b" * 64] * -(-size // CHUNK),
        devices=devices,
        groups=groups,
        rollback=rollback,
        ttl_s=ttl,
        now=NOW,
        **kw,
    )


@pytest.fixture(scope="module")
def keypair(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    key_path, pub_path, kid = keys.generate(d)
    return keys.load_private_key(key_path), keys.trusted_keys([pub_path]), kid


@pytest.fixture(scope="module")
def other_key(tmp_path_factory):
    key_path, _, _ = keys.generate(tmp_path_factory.mktemp("other"))
    return keys.load_private_key(key_path)


def code_of(fn):
    with pytest.raises(ManifestRejected) as info:
        fn()
    assert isinstance(info.value, ManifestError)
    return info.value.code


def test_roundtrip_and_key_id(keypair):
    priv, trusted, kid = keypair
    m = make(qualification={"providers": ["cpu"], "tolerance": {"max_abs": 0.01}})
    got = receive(m.sign(priv), trusted, "1", device_id="pi-1", now=NOW + 1)
    assert got == m and got.key_id == kid and got.qualification["tolerance"]["max_abs"] == 0.01


def test_key_file_mode_and_refuses_overwrite(tmp_path):
    key_path, pub_path, _ = keys.generate(tmp_path)
    assert key_path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(Exception, match="refusing to overwrite"):
        keys.generate(tmp_path)


def test_canonical_encoding_is_sorted_compact_utf8():
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


def test_unsigned_wrong_key_and_tampered(keypair, other_key):
    priv, trusted, _ = keypair
    env = json.loads(make().sign(priv))
    unsigned = json.dumps({"manifest": env["manifest"]}).encode()
    assert code_of(lambda: receive(unsigned, trusted, now=NOW)) == "unsigned"
    assert code_of(lambda: receive(make().sign(other_key), trusted, now=NOW)) == "untrusted-key"
    env["manifest"]["version"] = "99"  # tampered after signing
    assert code_of(lambda: receive(json.dumps(env).encode(), trusted, now=NOW)) == "bad-signature"
    env2 = json.loads(make().sign(priv))
    env2["signature"] = base64.b64encode(other_key.sign(canonical_json(env2["manifest"]))).decode()
    assert code_of(lambda: receive(json.dumps(env2).encode(), trusted, now=NOW)) == "bad-signature"


def test_expired(keypair):
    priv, trusted, _ = keypair
    env = make(ttl=60).sign(priv)
    assert receive(env, trusted, now=NOW + 59).version == "2"
    err = pytest.raises(ManifestRejected, receive, env, trusted, now=NOW + 60).value
    assert err.code == "expired" and err.model == "resnet" and err.version == "2"


def test_downgrade_and_signed_rollback(keypair):
    priv, trusted, _ = keypair
    assert code_of(lambda: receive(make("2").sign(priv), trusted, "2", now=NOW)) == "downgrade"
    assert code_of(lambda: receive(make("1.9").sign(priv), trusted, "2.0", now=NOW)) == "downgrade"
    assert receive(make("2.0.1").sign(priv), trusted, "2", now=NOW).version == "2.0.1"
    assert receive(make("1", rollback=True).sign(priv), trusted, "2", now=NOW).rollback is True


def test_versions_compare_numerically():
    assert (
        compare_versions("10", "9") == 1 and compare_versions("1.0", "1") == 0 and compare_versions("1.2", "1.10") == -1
    )
    for bad in ("", "1.", "v1", "1..2", "-1", "1.a", None, 3):
        with pytest.raises(ManifestError):
            compare_versions(bad, "1")


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", ".hidden", "a..b", "x" * 65, "", "a b", "a+b", "a#", "ä"])
def test_path_traversal_and_unsafe_names(keypair, name):
    priv, trusted, _ = keypair
    d = make().to_dict()
    d["name"] = name
    env = json.dumps(
        {
            "manifest": d,
            "signature": base64.b64encode(priv.sign(canonical_json(d))).decode(),
            "key_id": keys.key_id(priv.public_key()),
        }
    )
    assert code_of(lambda: receive(env, trusted, now=NOW)) == "invalid-name"
    with pytest.raises(ManifestError):
        make(name=name)


def test_targeting(keypair):
    priv, trusted, _ = keypair
    env = make(devices=(), groups=("lab",)).sign(priv)
    assert receive(env, trusted, device_id="pi-9", groups=["lab"], now=NOW).groups == ("lab",)
    assert code_of(lambda: receive(env, trusted, device_id="pi-9", groups=["prod"], now=NOW)) == "not-targeted"


def test_oversize_and_no_space(keypair):
    priv, trusted, _ = keypair
    env = make(size=10 * CHUNK).sign(priv)
    assert code_of(lambda: receive(env, trusted, now=NOW, max_artifact_bytes=9 * CHUNK)) == "too-large"
    assert code_of(lambda: receive(env, trusted, now=NOW, free_bytes=5 * CHUNK)) == "no-space"
    assert receive(env, trusted, now=NOW, max_artifact_bytes=10 * CHUNK, free_bytes=10 * CHUNK)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("expires_at"),
        lambda d: d.update(extra=1),
        lambda d: d["artifact"].update(size=99999),  # chunk count no longer matches
        lambda d: d["artifact"].update(sha256="A" * 64),
        lambda d: d["artifact"].update(chunk_size=10),
        lambda d: d["artifact"].update(format="zip"),
        lambda d: d.update(sources=[{"type": "ftp", "url": "ftp://x"}]),
        lambda d: d.update(sources=[]),
        lambda d: d.update(targeting={"devices": [], "groups": []}),
        lambda d: d.update(rollback="yes"),
        lambda d: d.update(version="2.x"),
        lambda d: d.update(issued_at=d["expires_at"]),
        lambda d: d.update(schema=2),
    ],
)
def test_malformed_but_validly_signed(keypair, mutate):
    priv, trusted, _ = keypair
    d = make().to_dict()
    mutate(d)
    env = json.dumps(
        {
            "manifest": d,
            "signature": base64.b64encode(priv.sign(canonical_json(d))).decode(),
            "key_id": keys.key_id(priv.public_key()),
        }
    )
    assert code_of(lambda: receive(env, trusted, now=NOW)) in ("malformed", "invalid-name")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"manifest": 1}',
        b"\xff\xfe",
        b'{"a": NaN}',
        b'{"manifest":{},"signature":"!!","key_id":"0123456789abcdef"}',
        b'{"manifest":{},"signature":"AAAA","key_id":"0123456789abcdef"}',
    ],
)
def test_malformed_envelopes(keypair, raw):
    _, trusted, _ = keypair
    assert code_of(lambda: receive(raw, trusted, now=NOW)) in ("malformed", "unsigned", "untrusted-key")


def test_rejection_record_is_what_status_shows(keypair):
    priv, trusted, _ = keypair
    err = pytest.raises(ManifestRejected, receive, make("1").sign(priv), trusted, "3", now=NOW).value
    rec = rejection_record(err, ts=5.0)
    assert rec["state"] == rec["result"] == "rejected" and rec["version"] == "1" and "not newer" in rec["reason"]
