"""`edge-agent quantize PACKAGE --out DIR`: write a package of variants {fp32, int8} from an fp32 one."""

from __future__ import annotations

import json

import click


def _progress(event: str, **f) -> None:
    if event == "load":
        click.echo(f"quantize: loading {f.get('path')}", err=True)
    elif event == "quantize":
        sets = f" calibrated on {f['calibration_sets']} test set(s)" if f.get("calibration_sets") else ""
        click.echo(f"quantize: {f.get('mode')} int8 quantization{sets}", err=True)
    elif event == "warning":
        click.echo(f"warning: {f['message']}", err=True)
    elif event == "check":
        click.echo("quantize: checking the new package", err=True)


@click.command("quantize")
@click.argument("package", type=click.Path())
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Write the new package to DIR.")
@click.option(
    "--mode",
    type=click.Choice(["static", "dynamic"]),
    default="static",
    show_default=True,
    help="static: QDQ, activations calibrated on the package's test data; dynamic: weights only.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def quantize(package, out, mode, as_json):
    """Quantize PACKAGE's fp32 model to int8 with onnxruntime.quantization and write DIR: the package as it
    was (the fp32 variant), model.int8.onnx and a model.yaml declaring both variants. Qualification then
    measures both on every provider and serves the fastest passing pair."""
    from agent.qualify.quantize import quantize_package

    result = quantize_package(package, out, mode=mode, progress=_progress)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"wrote {result['out']}: variants fp32 ({result['variants']['fp32']}, {result['fp32_bytes']} bytes) and "
        f"int8 ({result['variants']['int8']}, {result['int8_bytes']} bytes, {result['mode']}, "
        f"ops {', '.join(result['quant_ops'])})"
    )
