"""agent.telemetry: health documents from sysroots (Pi, Jetson) and the host, real serving stats, /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.files import write_tree as tree

from agent.telemetry import Telemetry, collect, registry_stats, to_metrics


@pytest.fixture
def pi_root(tmp_path):
    return tree(
        tmp_path / "pi",
        {
            "sys/class/thermal/thermal_zone0/type": "cpu-thermal\n",
            "sys/class/thermal/thermal_zone0/temp": "81300\n",
            "sys/devices/platform/soc/soc:firmware/get_throttled": "50005\n",
        },
    )


@pytest.fixture
def jetson_root(tmp_path):
    gpu = "sys/class/devfreq/17000000.gpu"
    return tree(
        tmp_path / "jetson",
        {
            f"{gpu}/device/of_node/name": "ga10b\0",
            f"{gpu}/device/load": "734\n",
            f"{gpu}/cur_freq": "918000000\n",
            "sys/class/devfreq/15340000.vic/device/of_node/name": "vic\0",
            "sys/class/thermal/thermal_zone0/type": "cpu-thermal\n",
            "sys/class/thermal/thermal_zone0/temp": "47500\n",
            "sys/class/thermal/thermal_zone1/type": "gpu-thermal\n",
            "sys/class/thermal/thermal_zone1/temp": "45000\n",
        },
    )


def test_pi_throttling_and_temperature(pi_root):
    h = collect(None, None, pi_root)
    assert h["temperatures_c"] == {"cpu-thermal": 81.3}
    assert h["temperature_max_c"] == 81.3
    t = h["throttling"]
    assert t["raw"] == "0x50005"
    assert t["under_voltage"] and t["throttled"] and not t["freq_capped"]
    assert t["under_voltage_occurred"] and t["throttled_occurred"] and not t["soft_temp_limit_occurred"]
    assert h["gpu"] is None
    assert "cpu" not in h and "memory" not in h  # not the host: nothing read from this machine
    json.dumps(h)


def test_jetson_gpu_load(jetson_root):
    h = collect(None, None, jetson_root)
    assert h["gpu"] == {"device": "/sys/class/devfreq/17000000.gpu", "load_percent": 73.4, "freq_hz": 918000000}
    assert h["throttling"] is None
    assert h["temperatures_c"] == {"cpu-thermal": 47.5, "gpu-thermal": 45.0}
    # the GPU named by the hardware profile is used directly
    from agent.hardware.profile import Accelerator, HardwareProfile

    prof = HardwareProfile(
        accelerators=(Accelerator("gpu", "nvidia", "NVIDIA Ampere GPU (ga10b)", "/sys/class/devfreq/17000000.gpu"),)
    )
    assert collect(prof, None, jetson_root)["gpu"]["load_percent"] == 73.4


def test_garbled_sysfs_is_ignored_not_fatal(tmp_path):
    root = tree(
        tmp_path / "bad",
        {
            "sys/class/devfreq/x.gpu/device/of_node/name": "gpu\0",
            "sys/class/devfreq/x.gpu/device/load": "busy\n",
            "sys/class/thermal/thermal_zone0/temp": "hot\n",
            "sys/devices/platform/soc/soc:firmware/get_throttled": "zz\n",
        },
    )
    h = collect(None, None, root)
    assert h["gpu"] is None and h["throttling"] is None and h["temperatures_c"] == {}


def test_host_figures_and_disk(tmp_path):
    tele = Telemetry(tmp_path / "state-not-yet-created", device_id="pi-1")
    h = tele.collect()
    assert h["device_id"] == "pi-1"
    assert h["cpu"]["cores"] >= 1 and h["memory"]["total_bytes"] > h["memory"]["available_bytes"] > 0
    assert h["memory"]["agent_rss_bytes"] > 0
    assert h["disk"]["path"].endswith("state-not-yet-created") and h["disk"]["total_bytes"] > 0
    assert 0 <= h["disk"]["used_percent"] <= 100
    h2 = tele.collect()
    assert h2["cpu"]["percent"] is None or 0 <= h2["cpu"]["percent"] <= 100


def test_models_from_a_real_registry(tmp_path):
    from agent.providers import get
    from agent.samples import sample_tiny_package, seeded_feeds, tiny_model
    from agent.serving.registry import ModelRegistry

    pkg = sample_tiny_package(tmp_path / "tiny")
    model_path = next(Path(pkg).rglob("*.onnx"))
    reg = ModelRegistry()
    reg.activate("tiny", "3", get("cpu").open_session(model_path))
    feeds = seeded_feeds(tiny_model())
    for _ in range(70):
        reg.infer("tiny", feeds)
    tele = Telemetry(tmp_path, stats=lambda: registry_stats(reg))
    m = tele.collect()["models"]["tiny"]
    assert m["version"] == "3" and m["requests"] == 70 and m["errors"] == 0 and m["latency_samples"] == 70
    assert 0 < m["p50_ms"] <= m["p90_ms"] <= m["p99_ms"]
    reg.close()


def test_metrics_gauges(pi_root, jetson_root, tmp_path):
    from agent.serving.metrics import render

    text = render(to_metrics(collect(None, None, pi_root)))
    assert 'edge_agent_throttled{flag="under_voltage"} 1' in text
    assert 'edge_agent_throttled{flag="freq_capped"} 0' in text
    assert 'edge_agent_temperature_celsius{zone="cpu-thermal"} 81.3' in text
    assert text.count("# TYPE edge_agent_throttled gauge") == 1
    text = render(to_metrics(collect(None, None, jetson_root)))
    assert 'edge_agent_gpu_load_ratio{device="/sys/class/devfreq/17000000.gpu"} 0.734' in text
    host = render(Telemetry(tmp_path).collector())
    for name in ("edge_agent_memory_available_bytes", "edge_agent_disk_free_bytes", "edge_agent_load1"):
        assert f"# TYPE {name} gauge" in host
    assert "edge_agent_gpu_load_ratio" not in host
