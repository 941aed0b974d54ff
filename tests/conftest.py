"""Shared fixtures: real brokers on free ports, generated model packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from brokers import Mosquitto, NatsMqtt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def mosquitto(tmp_path):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture
def nats_mqtt(tmp_path):
    with NatsMqtt(tmp_path / "nats") as broker:
        yield broker


@pytest.fixture(params=["mosquitto", "nats"])
def any_broker(request, tmp_path):
    cls = Mosquitto if request.param == "mosquitto" else NatsMqtt
    with cls(tmp_path / request.param) as broker:
        yield broker


@pytest.fixture
def cnn_package(tmp_path):
    from agent.samples import sample_cnn_package

    return sample_cnn_package(tmp_path / "cnn")


@pytest.fixture
def ml_package(tmp_path):
    from agent.samples import sample_ml_package

    return sample_ml_package(tmp_path / "ml")


# Modules whose tests run longest (tens of seconds each: daemons, brokers, outages, rollouts), longest first.
# Run first, so that pytest-xdist's workers do not end on one of them while the other core idles. Order only:
# every test still runs, and none depends on another.
LONG_FIRST = (
    "test_probation_daemon.py",
    "test_realmodels_inbox.py",
    "test_emulated_pi.py",
    "test_daemon_mqtt.py",
    "test_fleet_trust.py",
    "test_mqtt_outages.py",
    "test_rollout_sim.py",
    "test_probation_agent.py",
    "test_lifecycle_drift.py",
    "test_mqtt_attacks.py",
    "test_conformance_hwtests.py",
    "test_daemon_mqtt_crash.py",
    "test_mqtt_flood.py",
    "test_oip_slowloris.py",
    "test_serving_registry.py",
    "test_quickstart.py",
    "test_simulator.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: the rest keep their order
