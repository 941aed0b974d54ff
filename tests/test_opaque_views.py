"""Views that said less than they knew (issue 28, 9): a queued deployment is shown as queued, not qualifying; a
failed conformance case whose runtime named an unsupported operator is counted under that cause; quantize warns
when it calibrates on too few inputs."""

from __future__ import annotations

from clirunner import edge_agent

from agent.cli.daemon import _in_flight_rows
from agent.conformance.causes import cause_of
from agent.samples import sample_cnn_package


def test_queued_deployments_say_so_with_their_place():
    doc = {
        "in_flight": {"a": "qualifying", "b": "qualifying", "c": "qualifying", "d": "downloading"},
        "deployments": {"a": {"version": "1"}, "b": {"version": "2"}, "c": {"version": "7"}, "d": {"version": "3"}},
        "qualification_queue": {"running": "a 1 (dep-a)", "waiting": ["c 7 (dep-c)", "b 2 (dep-b)"]},
    }
    rows = dict((n, s) for n, _, s in _in_flight_rows(doc))
    assert rows == {
        "a": "qualifying",
        "b": "queued for qualification (2 ahead)",
        "c": "queued for qualification (1 ahead)",
        "d": "downloading",
    }


def test_an_unsupported_operator_is_named_whatever_the_case_status():
    reason = "openvino: unsupported operator(s) ai.onnx.ml.TreeEnsemble: no conversion rule"
    assert (
        cause_of("failed", reason)
        == cause_of("errored", reason)
        == "operator (or this opset/type of it) not implemented"
    )
    assert cause_of("failed", "something new") == "failed (other)"


def test_quantize_warns_when_calibrating_on_one_input_set(tmp_path):
    pkg = sample_cnn_package(tmp_path / "cnn")  # one test_data_set
    r = edge_agent("quantize", pkg, "--out", tmp_path / "q")
    assert r.returncode == 0, r.stderr
    assert "warning: static quantization calibrates on 1 input set(s)" in r.stderr, r.stderr
