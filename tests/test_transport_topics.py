"""Topic tree: every builder parses back, and ids that could escape the tree are refused."""

import pytest

from agent.errors import TransportError
from agent.transport.mqtt import BrokerConfig
from agent.transport.topics import Topics, check_prefix
from agent.transport.topics import filter_matches as _matches


def test_build_and_parse_roundtrip():
    t = Topics("site/a")
    assert t.device_desired("pi-1", "resnet") == "site/a/devices/pi-1/desired/resnet"
    cases = {
        t.device_desired("pi-1", "m.v2"): ("device_desired", "pi-1", None, "m.v2"),
        t.group_desired("lab", "m"): ("group_desired", None, "lab", "m"),
        t.status("pi-1"): ("status", "pi-1", None, None),
        t.events("pi-1"): ("events", "pi-1", None, None),
        t.health("pi-1"): ("health", "pi-1", None, None),
        t.artifacts("pi-1"): ("artifacts", "pi-1", None, None),
        t.artifact_req("pi-1"): ("artifact_req", "pi-1", None, None),
    }
    for topic, (kind, dev, group, model) in cases.items():
        p = t.parse(topic)
        assert (p.kind, p.device, p.group, p.model) == (kind, dev, group, model)
    assert t.parse(t.rollout("r1")).rollout == "r1"
    assert t.parse("edge/devices/pi-1/status") is None  # other prefix
    assert t.parse("site/a/devices/../status") is None
    assert t.parse("site/a/devices/pi-1/desired/a/b") is None


@pytest.mark.parametrize("bad", ["", "..", "a/b", "+", "#", "a b", "-x", "x" * 65, "a..b", None, 7])
def test_bad_ids_are_refused(bad):
    with pytest.raises(TransportError):
        Topics().status(bad)
    with pytest.raises(TransportError):
        Topics().device_desired("ok", bad)


@pytest.mark.parametrize("bad", ["", "/edge", "edge/", "$SYS", "a/+/b", "a/#", "a//b"])
def test_bad_prefixes(bad):
    with pytest.raises(TransportError):
        check_prefix(bad)


def test_filters_and_shared_subscription():
    t = Topics()
    assert t.artifact_req_filter(shared=True) == "$share/edge-artifacts/edge/artifacts/req/+"
    assert _matches(t.artifact_req_filter(True), t.artifact_req("pi-1"))
    assert _matches(t.all_status(), t.status("x")) and not _matches(t.all_status(), t.events("x"))
    assert _matches("edge/#", "edge/a/b") and not _matches("edge/+", "edge/a/b")


def test_broker_urls():
    assert BrokerConfig("mqtt://h").endpoint() == ("h", 1883, False, 0)
    assert BrokerConfig("mqtts://h:9999?protocol=3.1.1").endpoint() == ("h", 9999, True, 4)
    assert BrokerConfig("mqtt://u:p%40ss@h:1").credentials() == ("u", "p@ss")
    assert "p%40ss" not in BrokerConfig("mqtt://u:p%40ss@h:1").redacted()
    for bad in ("http://h", "mqtt://", "mqtt://h:notaport", "mqtt://h?protocol=4"):
        with pytest.raises(TransportError):
            BrokerConfig(bad).endpoint()
