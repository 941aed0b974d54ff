"""Shared fixtures: real brokers on free ports, generated model packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from brokers import Mosquitto, NatsCluster, NatsMqtt  # noqa: E402
from cp_support import db_url, pg_server  # noqa: E402,F401 - the control-plane suites' SQLite/PostgreSQL fixtures
from lanes import SYSTEM  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


def pytest_collection_modifyitems(config, items):
    """The system lane (tests/lanes.py): its modules' tests get the `system` marker, field tests excepted.

    The emulated Pi's tests last. pytest-xdist's worksteal hands each worker an even, contiguous share of the
    collection first, so the last worker starts with them and builds the rootfs at once, while the first runs
    the rest of the field lane; in collection order the first worker got two of them early and sat on the build's
    lock with the NATS, probation and real-model tests queued behind the building worker's share."""
    for item in items:
        module = Path(str(item.fspath)).stem
        if module in SYSTEM and item.get_closest_marker("field") is None:
            item.add_marker(pytest.mark.system)
    last = [item for item in items if item.path.name == "test_emulated_pi.py"]
    if last and len(last) < len(items):
        keep = set(map(id, last))
        items[:] = [item for item in items if id(item) not in keep] + last


@pytest.fixture
def mosquitto(tmp_path):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture
def nats_mqtt(tmp_path):
    with NatsMqtt(tmp_path / "nats") as broker:
        yield broker


@pytest.fixture
def nats_cluster(tmp_path):
    """Three nats-server nodes, JetStream clustered, MQTT on each: .urls, .url (comma-joined), .kill(i), .restart(i)."""
    with NatsCluster(tmp_path / "nats-cluster") as cluster:
        yield cluster


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


@pytest.fixture
def plane(tmp_path, mosquitto):
    """A test control plane (support.mqtt.ControlPlane) serving artifacts, on the test's Mosquitto."""
    from support.mqtt import ControlPlane

    cp = ControlPlane(tmp_path / "cp", mosquitto)
    cp.serve()
    yield cp
    cp.close()
