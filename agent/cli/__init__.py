"""The command-line interface: the only place that prints or exits.

Subcommands live one module per command (agent/cli/<name>.py) and are imported lazily, so
`edge-agent --help` and `edge-agent profile` never import onnxruntime, openvino or paho.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import sys

import click

from agent import __version__
from agent.errors import EdgeAgentError


class LazyGroup(click.Group):
    """A click group whose subcommands are 'module:attribute' strings, imported on first use."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in self._lazy:
            return cmd
        target, short_help = self._lazy[name]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("agent"):
                return _unavailable(name, short_help, f"{module_name} is not part of this build")
            raise
        from agent.cli.examples import attach

        path = " ".join((ctx.command_path or "").split()[1:] + [name])
        return attach(getattr(module, attr), path)

    def format_commands(self, ctx, formatter):
        # Show short help without importing every subcommand module.
        rows = []
        for name in self.list_commands(ctx):
            if name in self._lazy:
                rows.append((name, self._lazy[name][1]))
            else:
                cmd = super().get_command(ctx, name)
                rows.append((name, cmd.get_short_help_str(80) if cmd else ""))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _unavailable(name: str, short_help: str, why: str) -> click.Command:
    @click.command(name=name, help=short_help)
    def _cmd():
        raise EdgeAgentError(f"'{name}' is unavailable: {why}")

    return _cmd


COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("agent.cli.profile:profile", "Show this device's hardware profile and matching target."),
    "providers": ("agent.cli.providers:providers", "Rank execution providers for this device and explain each."),
    "qualify": ("agent.cli.qualify:qualify", "Measure a model on each provider and select the best."),
    "conformance": (
        "agent.cli.conformance:conformance",
        "Run the hardware conformance suite; write JSON, HTML, JUnit.",
    ),
    "keys": ("agent.cli.keys:keys", "Manage fleet signing keys."),
    "release": ("agent.cli.release:release", "Build, verify, install and activate releases of edge-agent itself."),
    "attestation": ("agent.cli.attestations:attestation", "Verify a device's signed qualification evidence offline."),
    "fleet": ("agent.cli.fleet:fleet", "Control plane: push, rollout, serve artifacts, fleet status."),
    "run": ("agent.cli.daemon:run", "Run the device daemon."),
    "status": ("agent.cli.daemon:status", "Show local models, versions, providers and deployments."),
    "rollback": ("agent.cli.daemon:rollback", "Roll a model back to its previous committed version."),
    "cancel": ("agent.cli.daemon:cancel", "Cancel a model's in-flight deployment, in any state."),
    "config": ("agent.cli.config:config", "Check agent configuration files."),
    "control-plane": (
        "agent.cli.control_plane:control_plane",
        "Run the control-plane service: device registry, API, dashboard, rollouts.",
    ),
    "quantize": ("agent.cli.quantize:quantize", "Write an fp32 package's int8 variant (onnxruntime.quantization)."),
    "package": ("agent.cli.package:package", "Build a model package from your model and real inputs, or check one."),
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edge-agent")
def cli():
    """edge-agent: deploy ONNX models to edge devices and prove, on each device, that they run
    correctly and fast before they serve.

    \b
    Examples:
      edge-agent profile                      what is this device, which target matches
      edge-agent providers --verify           rank execution providers, open a real session on each
      edge-agent qualify pkg/                 measure every provider, select the best, with evidence
      edge-agent run --config agent.yaml
      edge-agent fleet push pkg/ --name sample-tiny --version 1 --group quickstart --key keys/fleet.key --store cp-store --broker mqtt://broker:1883 --wait 600

    Set EDGE_AGENT_DEBUG=1 to see tracebacks for unexpected errors.
    """


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one clear line on error, never a traceback (unless debugging).
    `kill -USR1 PID` prints every thread's stack to stderr (a command that hangs says where)."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        rc = cli.main(args=argv, prog_name="edge-agent", standalone_mode=False)
        # Without standalone mode click returns ctx.exit(code)'s code instead of exiting.
        if isinstance(rc, int) and rc != 0:
            sys.exit(rc)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "edge-agent"
        click.echo(f"error: {exc.format_message().rstrip('.')} (see '{where} --help')", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except EdgeAgentError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the CLI is the last line of defence
        if os.environ.get("EDGE_AGENT_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} (set EDGE_AGENT_DEBUG=1 for a traceback)", err=True)
        sys.exit(70)
