"""Start-up stays light: importing agent, the CLI, hardware detection and targets loads no runtime."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("onnxruntime", "openvino", "paho")

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
CliRunner().invoke(agent.cli.cli, ["profile", "--json"])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
""" % (HEAVY,)


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
