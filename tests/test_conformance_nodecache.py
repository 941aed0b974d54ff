"""The on-disk cache of onnx's generated node cases: kept private, read only when private, regenerated when
damaged, and the cases read back are the ones onnx generates."""

from __future__ import annotations

import os

import numpy as np
import pytest

from agent.conformance import nodecache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_CACHE_DIR", str(tmp_path / "c"))
    return tmp_path / "c"


def _counting(value):
    calls = []

    def generate():
        calls.append(1)
        return value

    return generate, calls


def test_kept_private_and_read_back(cache):
    value = (("test_x", "X", b"\x08\x07", [np.arange(3, dtype=np.float32)], [["a", "b"]], 1e-3, 1e-7),)
    gen, calls = _counting(value)
    first = nodecache.load_or_generate(gen)
    again = nodecache.load_or_generate(gen)
    assert calls == [1]  # the second call read the file
    path = nodecache.cache_file()
    assert path is not None and path.parent == cache
    assert oct(cache.stat().st_mode & 0o777) == "0o700" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert again[0][:3] == first[0][:3] and np.array_equal(again[0][3][0], value[0][3][0])


@pytest.mark.parametrize("damage", ["group-writable file", "open directory", "garbage", "truncated"])
def test_a_cache_it_cannot_trust_or_read_is_generated_again(cache, damage):
    gen, calls = _counting(("v",))
    nodecache.load_or_generate(gen)
    path = nodecache.cache_file()
    if damage == "group-writable file":
        os.chmod(path, 0o620)
    elif damage == "open directory":
        os.chmod(cache, 0o777)
    elif damage == "garbage":
        path.write_bytes(b"not a pickle")
    else:
        path.write_bytes(path.read_bytes()[:10])
    assert nodecache.load_or_generate(gen) == ("v",)
    assert calls == [1, 1]


def test_no_home_no_cache(monkeypatch):
    for var in ("EDGE_AGENT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)
    gen, calls = _counting(("v",))
    assert nodecache.cache_file() is None
    assert nodecache.load_or_generate(gen) == ("v",) and nodecache.load_or_generate(gen) == ("v",)
    assert calls == [1, 1]


def test_cached_cases_are_the_generated_ones(cache):
    """The real node cases through the cache equal a fresh generation by onnx (names, ops, models, data)."""
    from agent.conformance import node

    fresh = node._generate()
    cached = nodecache.load_or_generate(node._generate)  # generates and keeps
    read = nodecache.load_or_generate(lambda: pytest.fail("the cache was not read"))
    assert len(read) == len(fresh) == len(cached) > 1000
    for a, b in zip(fresh, read):
        assert a[:3] == b[:3] and a[5:] == b[5:]
        for xa, xb in zip(a[3] + a[4], b[3] + b[4]):
            if isinstance(xa, np.ndarray):
                assert xa.dtype == xb.dtype and xa.shape == xb.shape
                assert xa.tobytes() == xb.tobytes() if xa.dtype.kind != "O" else list(xa.ravel()) == list(xb.ravel())
            else:
                assert type(xa) is type(xb)
