"""Availability means a session opened (agent.providers.opened), cached per runtime version and profile."""

from __future__ import annotations

import json

import pytest

from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.providers import get, opened
from agent.providers.base import ProbeResult

HOST = HardwareProfile(arch="x86_64", os="linux", cpu=CpuInfo(model="test", vendor="test", cores=2))


def _ov(devices):
    if not get("openvino").probe(HOST).available:
        pytest.skip("openvino is not installed here")
    return ProbeResult(name="openvino", available=True, reason="claimed", devices=tuple(devices))


def test_a_claimed_device_the_runtime_cannot_open_is_dropped_with_the_reason(tmp_path):
    import openvino as ov

    if "NPU" in ov.Core().available_devices:
        pytest.skip("this host has an NPU")
    (r,) = opened.confirm([_ov(["NPU", "CPU"])], HOST, tmp_path / "opened.json")
    assert r.available and r.opened is True and r.devices == ("CPU",)
    assert "session opened on CPU" in r.reason and "not on NPU" in r.reason


def test_a_provider_that_opens_on_no_device_is_unavailable_with_why_and_how_to_fix(tmp_path):
    import openvino as ov

    if "NPU" in ov.Core().available_devices:
        pytest.skip("this host has an NPU")
    (r,) = opened.confirm([_ov(["NPU"])], HOST, tmp_path / "opened.json")
    assert not r.available and r.opened is False
    assert r.reason.startswith("unavailable: no session opened (NPU: ") and r.remedy


def test_the_result_is_cached_per_runtime_version_and_profile(tmp_path):
    cache = tmp_path / "opened.json"
    probe = get("cpu").probe(HOST)
    (first,) = opened.confirm([probe], HOST, cache)
    assert first.available and first.opened
    stored = json.loads(cache.read_text())
    assert list(stored.values()) == [{"CPU": None}]  # the device the session says it runs on
    # a cached failure for the same runtime and profile is believed without opening again
    cache.write_text(json.dumps({k: {"cpu": "cached failure"} for k in stored}))
    (again,) = opened.confirm([probe], HOST, cache)
    assert not again.available and "cached failure" in again.reason
    # another runtime version is another key: opened afresh
    newer = ProbeResult(**{**probe.__dict__, "versions": {**probe.versions, "onnxruntime": "99.0"}})
    (fresh,) = opened.confirm([newer], HOST, cache)
    assert fresh.available and len(json.loads(cache.read_text())) == 2


def test_a_capture_is_expected_never_available():
    probe = get("cpu").probe(HOST)
    (r,) = opened.expected([probe], "capture rpi5")
    assert not r.available and r.expected and r.opened is None
    assert r.reason.startswith("expected, not opened here: ") and "capture rpi5" in r.reason
