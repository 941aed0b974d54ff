"""Start-up stays light: importing agent, the CLI, --help, profile and config check load no runtime and no numpy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("onnxruntime", "openvino", "paho", "numpy", "onnx")

SCRIPT = """
import json, sys
import agent, agent.cli, agent.hardware.detect, agent.targets
from agent.hardware import detect
from agent.targets import load_targets, match
prof = detect("/")
match(prof)
load_targets()
from click.testing import CliRunner
CliRunner().invoke(agent.cli.cli, ["--help"])
for args in (["profile", "--json"], ["profile", "--help"], ["providers", "--help"], ["config", "device-id"],
             ["config", "check", %r], ["--version"]):
    res = CliRunner().invoke(agent.cli.cli, args)
    assert res.exit_code == 0, (args, res.output)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
""" % (str(ROOT / "systemd" / "agent.yaml"), HEAVY)  # noqa: UP031


def test_imports_do_not_load_runtimes():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


def test_the_check_can_fail():
    # the same probe sees a runtime once one is imported, so the test above is not vacuous
    script = SCRIPT.replace("import json, sys", "import json, sys, onnxruntime")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "onnxruntime" in json.loads(res.stdout.strip().splitlines()[-1])
