"""`edge-agent package`: build a model package from your own model and real sample inputs, or check one."""

from __future__ import annotations

import json
import sys

import click


class _Greedy(click.Option):
    """An option that takes every following argument up to the next option (`--inputs a.npy b.npy`)."""

    def add_to_parser(self, parser, ctx):
        super().add_to_parser(parser, ctx)
        name = self.opts[0]
        our = parser._long_opt.get(name)
        if our is None:  # pragma: no cover - click's parser always registers long options
            return
        previous = our.process

        def process(value, state):
            values = [value]
            while state.rargs and not state.rargs[0].startswith("-"):
                values.append(state.rargs.pop(0))
            for v in values:
                previous(v, state)

        our.process = process


EXAMPLES = """
\b
Examples:
  edge-agent package pkg/model.onnx --inputs pkg/test_data_set_0/input_0.pb --out my-model
  edge-agent package pkg/model.onnx --inputs pkg/test_data_set_0/input_0.pb --out my-model --name det --version 2
  edge-agent package --check pkg/
"""


@click.command("package", epilog=EXAMPLES)
@click.argument("model", type=click.Path(exists=True, dir_okay=False), required=False)
@click.option(
    "--inputs",
    "inputs",
    cls=_Greedy,
    multiple=True,
    metavar="FILE...",
    type=click.Path(exists=True, dir_okay=False),
    help="Sample inputs: .npy (one input each, in the model's input order), .npz (named), .pb, .wav, images. "
    "Each complete set becomes one test_data_set_N.",
)
@click.option("--out", "out", type=click.Path(file_okay=False), help="Package directory to write.")
@click.option("--name", help="Model name in model.yaml (default: the file's stem).")
@click.option("--version", "version", default="1", show_default=True, help="Model version in model.yaml.")
@click.option("--task", help="Task (classification, detection, regression, embeddings, ...).")
@click.option("--force", is_flag=True, help="Overwrite a non-empty --out directory.")
@click.option(
    "--check", "check_dir", type=click.Path(exists=True), help="Check a package and print every fix it needs."
)
@click.option(
    "--max-input-bytes",
    type=click.IntRange(min=1),
    help="What all --inputs together may decode into; a file declaring more is refused before it is read "
    "(default: a quarter of the memory free to the process, at most 1 GiB).",
)
@click.option(
    "--generative",
    type=click.Path(exists=True, file_okay=False),
    help="Write a generative package (docs/generative.md) from DIR in onnxruntime-genai's layout (genai_config.json) "
    "or OpenVINO GenAI's (openvino_model.xml and its tokenizer IRs, as optimum-cli export openvino writes them).",
)
@click.option("--prompt", "prompts", multiple=True, help="A judge prompt of a --generative package (repeatable).")
@click.option(
    "--max-length",
    type=click.IntRange(min=2),
    help="A --generative package's longest sequence (default: what DIR declares; required where it declares none).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def package(
    model, inputs, out, name, version, task, force, check_dir, max_input_bytes, generative, prompts, max_length, as_json
):
    """Write a package the daemon accepts: model.onnx, model.yaml with the input shapes read off your inputs,
    and golden data (your inputs, and the outputs of onnxruntime's CPU provider on the model as given).
    With --check DIR, validate a hand-made package instead."""
    from pathlib import Path

    from agent.package import build as packager

    if check_dir:
        from agent.package.check import check

        found = check(Path(check_dir))
        if as_json:
            click.echo(
                json.dumps({"package": check_dir, "ok": not found, "fixes": [f.to_dict() for f in found]}, indent=2)
            )
        elif not found:
            click.echo(f"{check_dir}: ok (" + _accepts(Path(check_dir)) + ")")
        else:
            click.echo(f"{check_dir}: {len(found)} fix(es) needed")
            for f in found:
                click.echo(f"  {f.where}: {f.problem}\n    fix: {f.fix}")
        sys.exit(0 if not found else 1)
    if generative:
        return _generative(Path(generative), out, name, version, list(prompts), force, max_length, as_json)
    if not model or not out:
        raise click.UsageError("give MODEL and --out DIR (or --check DIR)")
    if not inputs:
        raise click.UsageError("give --inputs FILE... (real sample inputs: the golden data come from them)")
    built = packager.build(
        Path(model),
        [Path(p) for p in inputs],
        Path(out),
        label=packager.Label(name=name, version=version, task=task),
        force=force,
        max_input_bytes=max_input_bytes,
    )
    if as_json:
        click.echo(json.dumps(built.to_dict(), indent=2))
        return
    click.echo(f"wrote {built.out}: {built.name} v{built.version}, {built.sets} golden set(s)")
    for inp, dims in built.symbolic.items():
        seen = ", ".join(f"{d} in {v}" for d, v in dims.items())
        click.echo(f"  input {inp}: symbolic {seen} -> input_shapes {built.input_shapes.get(inp)}")
    for note in built.notes:
        click.echo(f"  converted: {note}")
    click.echo(f"  golden outputs: {built.golden_source}")
    click.echo(f"next: edge-agent qualify {built.out}")


def _accepts(path) -> str:
    from agent.generative.package import is_generative

    if is_generative(path):
        return "edge-agent qualify measures it; a daemon serves it from serving.generative"
    return "the daemon will accept and qualify it"


def _generative(src, out, name, version, prompts, force, max_length, as_json) -> None:
    from pathlib import Path

    from agent.generative.package import check_generative, write_from_builder

    if not out or not prompts:
        raise click.UsageError("give --out DIR and at least one --prompt TEXT (the judge prompts) with --generative")
    written = write_from_builder(
        src, Path(out), name=name, version=version, prompts=prompts, force=force, max_length=max_length
    )
    found = check_generative(written)
    if as_json:
        click.echo(json.dumps({"package": str(written), "ok": not found, "fixes": [list(f) for f in found]}, indent=2))
    else:
        click.echo(f"wrote {written} (kind: generative)" + "".join(f"\n  {w}: {p}\n    fix: {f}" for w, p, f in found))
        click.echo(f"next: edge-agent qualify {written}")
    if found:
        sys.exit(1)
