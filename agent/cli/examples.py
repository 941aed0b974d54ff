"""One example (or a few) for every command's --help, kept in one place so that no command ships without one
(tests/test_cli_convention.py walks every command)."""

from __future__ import annotations

import click

EXAMPLES: dict[str, tuple[str, ...]] = {
    "attestation verify": ("edge-agent attestation verify qualification.json --device-key pi-1.pub --device pi-1",),
    "control-plane enroll": (
        "edge-agent control-plane enroll --agent-config /etc/edge-agent/agent.yaml --url http://cp:8470 "
        "--token-file enroll.token",
    ),
    "control-plane report": (
        "edge-agent control-plane report --agent-config /etc/edge-agent/agent.yaml --url http://cp:8470",
    ),
    "control-plane token": ("edge-agent control-plane --config cp.yaml token --name ci --role operator",),
    "fleet attestations": (
        "edge-agent fleet attestations --store cp --broker mqtt://broker:1883 --model resnet --json",
    ),
    "cancel": ("edge-agent cancel resnet --config /etc/edge-agent/agent.yaml",),
    "config device-id": ("edge-agent config device-id --json",),
    "conformance": (
        "edge-agent conformance --out report/",
        "edge-agent conformance --provider cpu --provider openvino --out report/ --json",
    ),
    "fleet push": (
        "edge-agent fleet push pkg/ --name resnet --version 3 --group lab --key fleet.key --store cp "
        "--broker mqtt://broker:1883 --wait 600",
    ),
    "fleet delete": ("edge-agent fleet delete pi-1 --control-plane http://cp:8470 --token-file admin.token",),
    "fleet register": ("edge-agent fleet register pi-1 --public-key pi-1.pub --group lab --store cp",),
    "fleet rollback": (
        "edge-agent fleet rollback resnet --group lab --key fleet.key --store cp --broker URL --wait 300",
    ),
    "fleet rollout": (
        "edge-agent fleet rollout pkg/ --name resnet --version 4 --all --cohort-by target --key fleet.key "
        "--store cp --broker mqtt://broker:1883 --wait 3600",
    ),
    "fleet serve": ("edge-agent fleet serve --store cp --broker mqtt://broker:1883 --http 0.0.0.0:8081",),
    "fleet simulate": ("edge-agent fleet simulate --devices 20 --trust fleet.pub --store cp --broker URL",),
    "fleet status": ("edge-agent fleet status --store cp --broker mqtt://broker:1883 --json",),
    "keys device": ("edge-agent keys device --config /etc/edge-agent/agent.yaml",),
    "keys generate": ("edge-agent keys generate --out keys/",),
    "keys show": ("edge-agent keys show keys/fleet.pub --json",),
    "qualify": (
        "edge-agent qualify model_dir/",
        "edge-agent qualify model.tar.gz --provider openvino --provider cpu --budget 10 --json",
    ),
    "quantize": ("edge-agent quantize model_dir/ --out model_int8/",),
    "rollback": ("edge-agent rollback resnet --config /etc/edge-agent/agent.yaml",),
    "run": ("edge-agent run --config /etc/edge-agent/agent.yaml",),
    "status": ("edge-agent status --config /etc/edge-agent/agent.yaml --json",),
}


def attach(cmd: click.Command, path: str) -> click.Command:
    """Give `cmd` its examples as an epilog unless its help already has some (a plain group's commands too;
    a lazy group attaches them as it loads each)."""
    from agent.cli import LazyGroup

    if isinstance(cmd, click.Group) and not isinstance(cmd, LazyGroup):
        for name, sub in cmd.commands.items():
            attach(sub, f"{path} {name}")
    if "Examples:" in (cmd.help or "") + (cmd.epilog or ""):
        return cmd
    lines = EXAMPLES.get(path)
    if lines:
        body = "\n".join(f"  {line}" for line in lines)
        cmd.epilog = ((cmd.epilog or "") + "\n\n\b\nExamples:\n" + body).lstrip("\n")
    return cmd
