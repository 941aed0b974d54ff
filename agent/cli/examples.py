"""One example (or a few) for every command's --help, kept in one place so that no command ships without one
(tests/test_cli_convention.py walks every command)."""

from __future__ import annotations

import click

# Every example runs as printed in the directory scripts/quickstart.sh leaves (keys/, cp-store/, agent.yaml of
# device quickstart-device in group quickstart, pkg/ holding sample-tiny 1) with pkg-2/ (sample-tiny 2, another
# model) and cp.yaml (the control plane) beside them; tests/test_help_examples.py runs them all there, against a
# broker, daemon and service of its own.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "attestation verify": (
        'edge-agent attestation verify "$(ls state/attestations/*.qualification.intoto.json | head -1)" '
        "--device-key state/device.pub --device quickstart-device",
    ),
    "control-plane enroll": (
        "edge-agent control-plane enroll --agent-config agent.yaml --url http://cp:8470 --token-file enroll.token",
    ),
    "control-plane report": ("edge-agent control-plane report --agent-config agent.yaml --url http://cp:8470",),
    "control-plane token": ("edge-agent control-plane --config cp.yaml token --name ci --role operator",),
    "control-plane leader": ("edge-agent control-plane --config cp.yaml leader --json",),
    "fleet attestations": (
        "edge-agent fleet attestations --store cp-store --broker mqtt://broker:1883 --model sample-tiny --json",
    ),
    "cancel": ("edge-agent cancel sample-tiny --config agent.yaml",),
    "config device-id": ("edge-agent config device-id --json",),
    "conformance": (
        "edge-agent conformance --suite onnx-node -k 'test_conv*' --out report/",
        "edge-agent conformance --provider cpu --out report/ --json",
    ),
    "fleet push": (
        "edge-agent fleet push pkg/ --name sample-tiny --version 1 --group quickstart --key keys/fleet.key "
        "--store cp-store --broker mqtt://broker:1883 --wait 600",
        "edge-agent fleet push pkg-2/ --name sample-tiny --version 4 --device quickstart-device --key keys/fleet.key "
        "--store cp-store --broker mqtt://broker:1883",
    ),
    "fleet register": (
        "edge-agent fleet register quickstart-device --public-key state/device.pub --group quickstart --store cp-store",
    ),
    "fleet delete": (
        "edge-agent fleet delete quickstart-device --control-plane http://cp:8470 --token-file admin.token --json",
    ),
    "fleet unjudged": ("edge-agent fleet unjudged --control-plane http://cp:8470 --token-file admin.token --json",),
    "fleet rollback": (
        "edge-agent fleet rollback sample-tiny --group quickstart --key keys/fleet.key --store cp-store "
        "--broker mqtt://broker:1883 --wait 300",
    ),
    "fleet rollout": (
        "edge-agent fleet rollout pkg-2/ --name sample-tiny --version 2 --all --cohort-by target --key keys/fleet.key "
        "--store cp-store --broker mqtt://broker:1883 --wait 3600",
    ),
    "fleet serve": ("edge-agent fleet serve --store cp-store --broker mqtt://broker:1883 --http 127.0.0.1:8081",),
    "fleet simulate": (
        "edge-agent fleet simulate --devices 3 --trust keys/fleet.pub --store cp-store --broker mqtt://broker:1883",
        "edge-agent fleet simulate --devices 3 --trust keys/fleet.pub --broker mqtt://broker:1883 "
        "--control-plane http://cp:8470 --enroll-token-file enroll.token",
    ),
    "fleet status": ("edge-agent fleet status --store cp-store --broker mqtt://broker:1883 --json",),
    "keys device": ("edge-agent keys device --config agent.yaml",),
    "keys generate": ("edge-agent keys generate --out new-keys/",),
    "keys show": ("edge-agent keys show keys/fleet.pub --json",),
    "qualify": (
        "edge-agent qualify pkg/",
        "edge-agent qualify pkg/ --provider cpu --budget 2 --json",
    ),
    "quantize": ("edge-agent quantize pkg/ --out pkg-int8/",),
    "release activate": ("edge-agent release activate 0.1.0 --root opt/ --config agent.yaml",),
    "release build": ("edge-agent release build --out release/ --key keys/fleet.key --no-deps",),
    "release install": ("edge-agent release install release/ --root opt/ --trust keys/fleet.pub",),
    "release list": ("edge-agent release list --root opt/ --json",),
    "release reports": ("edge-agent release reports --root opt/ --config agent.yaml --json",),
    "release verify": ("edge-agent release verify release/ --trust keys/fleet.pub --json",),
    "rollback": ("edge-agent rollback sample-tiny --config agent.yaml",),
    "run": ("edge-agent run --config agent.yaml",),
    "status": ("edge-agent status --config agent.yaml --json",),
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
