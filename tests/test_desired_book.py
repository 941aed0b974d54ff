"""DesiredBook: precedence from verified fields only; the clock-skew rule; transient-failure classification."""

from __future__ import annotations

import time

import pytest

from agent.artifacts.keys import generate, key_id, load_private_key
from agent.artifacts.manifest import Manifest
from agent.errors import ArtifactError, TransportError
from agent.lifecycle.desired import MAX_SKEW_S, RECHECK_S, DesiredBook, version_order
from agent.lifecycle.retry import backoff

SHA = "a" * 64
DAY = 86400


@pytest.fixture
def keys(tmp_path):
    good = load_private_key(generate(tmp_path / "good")[0])
    bad = load_private_key(generate(tmp_path / "bad")[0])
    return good, bad


def _env(key, version, issued, devices=("dev-1",), groups=()):
    m = Manifest.create(
        name="m",
        version=version,
        sha256=SHA,
        size=10,
        chunk_size=1024,
        chunks=[SHA],
        devices=devices,
        groups=groups,
        now=issued,
    )
    return m.sign(key)


def _book(keys, clock):
    good = keys[0]
    return DesiredBook(lambda: {key_id(good.public_key()): good.public_key()}, "dev-1", ("lab",), clock=clock)


def test_an_untrusted_future_group_envelope_never_beats_the_device(keys):
    now = [time.time()]
    book = _book(keys, lambda: now[0])
    good, bad = keys
    assert book.update("device", "m", _env(good, "2", now[0]), "t/d") == []
    refused = book.update("group:lab", "m", _env(bad, "9", now[0] + 365 * DAY, (), ("lab",)), "t/g")
    assert [c.rejection.code for c in refused] == ["untrusted-key"]
    assert book.resolve("m").scope == "device"
    # a later, verified group push does win (a group push after a per-device rollout reaches the device)
    book.update("group:lab", "m", _env(good, "3", now[0] + 10, (), ("lab",)), "t/g")
    assert book.resolve("m").scope == "group:lab"


def test_device_beats_older_groups_and_the_highest_group_version_wins(keys):
    """The one "device beats group" rule, on verified fields (it used to be kept twice: here and, on
    unverified fields, in transport.device)."""
    now = [time.time()]
    good = keys[0]
    book = DesiredBook(lambda: {key_id(good.public_key()): good.public_key()}, "dev-1", ("lab", "lab2"))
    book.update("group:lab", "m", _env(good, "3", now[0] - 50, (), ("lab",)), "t/l")
    book.update("group:lab2", "m", _env(good, "4", now[0] - 40, (), ("lab2",)), "t/l2")
    assert book.resolve("m").scope == "group:lab2"  # among groups the highest version wins
    book.update("device", "m", _env(good, "2", now[0]), "t/d")
    assert book.resolve("m").scope == "device"  # the device's own beats older group pushes, even if lower
    book.update("device", "m", b"", "t/d")  # withdrawn: the groups' apply again
    assert book.resolve("m").scope == "group:lab2"


def test_future_dated_beyond_the_skew_is_refused_then_accepted_when_the_clock_catches_up(keys):
    now = [time.time()]
    book = _book(keys, lambda: now[0])
    issued = now[0] + 30 * DAY
    refused = book.update("device", "m", _env(keys[0], "2", issued), "t/d")
    assert refused[0].rejection.code == "future-dated" and "ahead of the device clock" in refused[0].rejection.reason
    assert book.resolve("m") is None
    now[0] = issued - MAX_SKEW_S / 2
    assert book.recheck()[0] == {"m"}  # verified again (RECHECK_S passed): now within the skew
    assert book.resolve("m") is not None and book.resolve("m").manifest.version == "2"


def test_within_the_skew_is_accepted_at_once(keys):
    now = [time.time()]
    book = _book(keys, lambda: now[0])
    assert book.update("device", "m", _env(keys[0], "2", now[0] + MAX_SKEW_S - 5), "t/d") == []
    assert book.resolve("m").manifest.version == "2"


def test_forged_and_withdrawn(keys):
    now = [time.time()]
    book = _book(keys, lambda: now[0])
    env = _env(keys[0], "2", now[0]).replace(b'"signature":"', b'"signature":"A')
    assert book.update("device", "m", env, "t/d")[0].rejection.code in ("malformed", "bad-signature")
    assert book.resolve("m") is None
    book.update("device", "m", _env(keys[0], "2", now[0]), "t/d")
    book.update("device", "m", b"", "t/d")
    assert book.resolve("m") is None


def test_version_order_and_backoff():
    m = Manifest.create(name="m", version="2", sha256=SHA, size=10, chunk_size=1024, chunks=[SHA], devices=["d"])
    assert version_order(m, "1") is None and version_order(m, "2").code == "downgrade"
    assert version_order(m, None) is None
    waits = [backoff(n) for n in range(1, 10)]
    assert all(0.5 * min(30, 2 ** (n - 1)) <= w <= min(30, 2 ** (n - 1)) for n, w in enumerate(waits, 1))
    assert RECHECK_S > 0


@pytest.mark.parametrize(
    ("version", "installed", "rollback", "code"),
    [
        ("2", None, False, None),
        ("2", "1", False, None),
        ("10", "9", False, None),  # numeric, not text, order
        ("2", "2", False, "downgrade"),
        ("2.0", "2", False, "downgrade"),  # trailing zeros do not count
        ("1.9", "2.0", False, "downgrade"),
        ("1", "2", True, None),  # a signed rollback may go back
        ("2", "2", True, None),
    ],
)
def test_one_downgrade_rule_from_both_call_sites(version, installed, rollback, code):
    """The manifest policy (at receive) and the MQTT source (against the committed version) ask the same rule."""
    from agent.artifacts.manifest import ManifestRejected, check_policy

    m = Manifest.create(
        name="m", version=version, sha256=SHA, size=10, chunk_size=1024, chunks=[SHA], devices=["d"], rollback=rollback
    )
    try:
        check_policy(m, installed)
        at_policy = None
    except ManifestRejected as exc:
        at_policy = (exc.code, str(exc))
    at_source = version_order(m, installed)
    assert at_policy == (None if at_source is None else (at_source.code, str(at_source)))
    assert (at_policy or (None,))[0] == code


def test_transient_classification(tmp_path):
    """By the error's type, never its text: a refused or short-of-disk pull is final, a stall or outage is not."""
    from agent.artifacts.fetch import is_transient
    from agent.artifacts.pull import check_space
    from agent.artifacts.store import ContentStore
    from agent.errors import ArtifactRefused, DiskFull

    assert is_transient(ArtifactError("download stalled (m 2: 0/10 bytes): no chunk for 30 s (connected)"))
    assert is_transient(TransportError("not connected"))
    assert is_transient(ArtifactError("http://x: HTTP 503 Service Unavailable"))
    assert is_transient(ArtifactError("a message that happens to say sha256 mismatch"))  # text decides nothing
    assert not is_transient(ArtifactRefused("chunk 3 failed its sha256 check 3 times: ..."))
    assert not is_transient(ArtifactRefused("http://x: HTTP 403 Forbidden"))
    assert not is_transient(ValueError("bug"))
    store = ContentStore(tmp_path / "blobs")
    try:
        check_space(store, store.free_bytes() + 1, 0, "m 2")
    except DiskFull as exc:
        assert not is_transient(exc) and "not enough disk" in str(exc)
    else:
        raise AssertionError("check_space let an artifact larger than the free space through")


def test_a_flood_of_refused_topics_never_evicts_verified_desired_state(keys, monkeypatch):
    from agent.lifecycle import desired

    monkeypatch.setattr(desired, "MAX_MODELS", 8)
    now = [time.time()]
    book = _book(keys, lambda: now[0])
    book.update("device", "m", _env(keys[0], "2", now[0]), "t/d")
    for i in range(100):
        book.update("device", f"x{i}", b"{junk", f"t/x{i}")
    assert len(book.models()) <= 8 and book.resolve("m") is not None


def test_the_skew_bound_is_configurable(tmp_path):
    from support.daemon import write_config

    from agent.config import load_config
    from agent.errors import ConfigError

    cfg = load_config(write_config(tmp_path / "a", extra={"trust": {"public_keys": [], "max_skew_s": 10}}))
    assert cfg.trust.max_skew_s == 10.0
    assert load_config(write_config(tmp_path / "b")).trust.max_skew_s == MAX_SKEW_S
    with pytest.raises(ConfigError, match="trust.max_skew_s"):
        load_config(write_config(tmp_path / "c", extra={"trust": {"max_skew_s": -1}}))
