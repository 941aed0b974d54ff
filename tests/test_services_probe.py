"""ProviderProbeService (agent.services.probe): given providers skip the probe; until a probe answers, the last
probe's list from status.json stands in, only when it was written for this target."""

from __future__ import annotations

import json

from agent.lifecycle.status_doc import status_path
from agent.services.probe import ProviderProbeService


def _service(tmp_path, known=None, target="generic-x86_64"):
    events: list[dict] = []
    probed: list[bool] = []
    s = ProviderProbeService(
        tmp_path, None, target, known=known, on_probed=lambda: probed.append(True), emit=events.append
    )
    return s, events, probed


def test_given_providers_are_not_probed(tmp_path):
    s, events, probed = _service(tmp_path, known=["openvino", "cpu"])
    s.start()
    s.stop()
    assert (s.providers(), s.source) == (["openvino", "cpu"], "given")
    assert events == [] and probed == []


def test_the_last_probe_stands_in_for_the_same_target_only(tmp_path):
    status_path(tmp_path).write_text(json.dumps({"target": "generic-x86_64", "providers": ["openvino", "cpu"]}))
    s, _, _ = _service(tmp_path)
    assert (s.providers(), s.source) == ([], "pending")
    s.load_last()
    assert (s.providers(), s.source) == (["openvino", "cpu"], "last probe")
    other, _, _ = _service(tmp_path, target="jetson-orin")
    other.load_last()
    assert (other.providers(), other.source) == ([], "pending")


def test_an_unreadable_status_file_is_no_last_probe(tmp_path):
    for text in ("{truncated", "[]", '{"target": "generic-x86_64", "providers": "cpu"}'):
        status_path(tmp_path).write_text(text)
        s, _, _ = _service(tmp_path)
        s.load_last()
        assert (s.providers(), s.source) == ([], "pending"), text
