"""Every available provider is measured: the target's list orders near-ties and excludes only with a reason."""

from __future__ import annotations

import dataclasses

import onnx
import pytest

from agent import samples
from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.providers import get
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions
from agent.targets import ProviderPref, get_target

PROFILE = HardwareProfile(arch="x86_64", os="linux", cpu=CpuInfo(model="test", vendor="test", cores=2))
FAST = QualifyOptions(latency_budget_s=0.05, row_timeout_s=120)


@pytest.fixture()
def tiny(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(samples.tiny_model(2.0), path)
    return path


def _only(*prefs: ProviderPref):
    base = get_target("generic-x86_64")
    return dataclasses.replace(base, providers=tuple(prefs))


def test_an_available_provider_the_target_does_not_list_is_still_measured(tiny):
    if not get("openvino").probe(PROFILE).available:
        pytest.skip("openvino is not available on this host")
    d = qualify(tiny, PROFILE, _only(ProviderPref("cpu")), options=FAST)
    keys = [r.key for r in d.results]
    assert keys[0] == "cpu" and "openvino" in keys  # the list orders; it does not decide what is measured
    assert all(r.status != "unavailable" for r in d.results)  # unlisted and absent: no row at all


def test_a_target_excludes_a_provider_only_with_a_reason_shown_in_the_row(tiny):
    target = _only(ProviderPref("cpu"), ProviderPref("openvino", exclude="vendor kernels miscompile Gelu here"))
    d = qualify(tiny, PROFILE, target, options=FAST)
    row = d.row("openvino")
    assert row is not None and row.status == "unavailable" and row.stage == "target"
    assert row.reason == "excluded by the generic-x86_64 target: vendor kernels miscompile Gelu here"
    assert d.selected == "cpu"


@pytest.mark.parametrize("name", ["raspberry-pi-4", "raspberry-pi-5", "generic-aarch64", "jetson-orin"])
def test_arm_targets_list_openvino(name):
    assert "openvino" in get_target(name).provider_names


def test_an_empty_exclusion_is_refused(tmp_path):
    import yaml

    from agent.errors import ConfigError
    from agent.targets import parse_target

    raw = yaml.safe_load(open(get_target("generic-x86_64").path, encoding="utf-8"))
    raw["providers"].append({"name": "cuda", "exclude": ""})
    out = tmp_path / "generic-x86_64.yaml"
    out.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"providers\[\d+\]\.exclude"):
        parse_target(out)
