"""The broker options every fleet command takes (--broker, auth, TLS) and the BrokerConfig they make."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from agent.errors import ConfigError

if TYPE_CHECKING:
    from agent.transport.mqtt import BrokerConfig


def broker_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--broker and the authentication/TLS options every fleet command takes."""
    opts = [
        click.option(
            "--broker",
            metavar="URL[,URL...]",
            help="mqtt://host:port or mqtts://host:port; a cluster's nodes comma-separated (fails over to the next). "
            "Required, unless a fleet context gives it or the command takes --control-plane and it is given.",
        ),
        click.option("--prefix", default="edge", show_default=True, help="Topic prefix."),
        click.option("--username", help="Broker user name."),
        click.option("--password-file", type=click.Path(dir_okay=False), help="File holding the broker password."),
        click.option("--ca", "ca_file", type=click.Path(dir_okay=False), help="CA bundle for mqtts://."),
        click.option("--cert", "cert_file", type=click.Path(dir_okay=False), help="Client certificate for mqtts://."),
        click.option("--cert-key", "cert_key_file", type=click.Path(dir_okay=False), help="Client certificate's key."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def broker_config(kw: dict[str, Any]) -> BrokerConfig:
    from agent.transport.mqtt import BrokerConfig

    if not kw.get("broker"):
        raise click.UsageError("missing option '--broker URL' (or --control-plane URL where the command takes it)")
    password = None
    if kw.get("password_file"):
        try:
            with open(kw["password_file"]) as fh:
                password = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"--password-file: cannot read {kw['password_file']}: {exc.strerror}") from None
    return BrokerConfig(
        kw["broker"],
        username=kw.get("username"),
        password=password,
        ca=kw.get("ca_file"),
        cert=kw.get("cert_file"),
        key=kw.get("cert_key_file"),
    )
