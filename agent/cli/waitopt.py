"""`--wait [SECONDS]`, the same on every command: how long to wait for devices; bare `--wait` waits up to a day."""

from __future__ import annotations

import click

WAIT_DEFAULT_S = 86400.0  # a bare --wait: the longest wait that still ends


def wait_option(what: str):
    """The --wait option: seconds to wait for `what` (bare --wait: up to a day; absent: do not wait)."""
    return click.option(
        "--wait",
        type=click.FloatRange(0, 7 * 86400),
        is_flag=False,
        flag_value=WAIT_DEFAULT_S,
        default=None,
        metavar="[SECONDS]",
        help=f"Wait up to SECONDS (bare --wait: {WAIT_DEFAULT_S / 3600:.0f} h) for {what}; progress on stderr.",
    )
