"""Where and how to reach the MQTT broker (or a cluster's nodes): URLs, credentials, TLS files, protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from agent.errors import TransportError

_PROTOCOLS = {"5": 5, "5.0": 5, "v5": 5, "3.1.1": 4, "311": 4, "v311": 4, "auto": 0}


@dataclass(frozen=True)
class BrokerConfig:
    """Where and how to connect: mqtt://host[:1883] or mqtts://host[:8883], optional ?protocol=5|3.1.1.

    Several brokers (the nodes of a cluster) are given comma-separated in `url` ("mqtt://a:1883,mqtt://b:1883")
    or as `fallbacks`: MqttLink connects to the first and moves to the next whenever a connection drops or fails.
    After construction `url` holds the first URL only and `fallbacks` the rest."""

    url: str
    username: str | None = None
    password: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    protocol: str = "auto"
    keepalive: int = 30
    fallbacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        urls = [u.strip() for u in self.url.split(",")] + [u.strip() for u in self.fallbacks]
        if not all(urls):
            raise TransportError(f"bad broker URL list {self.url!r}: an empty entry")
        object.__setattr__(self, "url", urls[0])
        object.__setattr__(self, "fallbacks", tuple(urls[1:]))

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.fallbacks)

    def endpoint(self) -> tuple[str, int, bool, int]:
        """(host, port, tls, protocol 5/4/0=auto) of the first URL; TransportError on a bad URL."""
        return self.endpoints()[0]

    def endpoints(self) -> list[tuple[str, int, bool, int]]:
        """endpoint() for every URL, in order; TransportError when one is bad or they mix TLS and plain."""
        found = [self._endpoint(url) for url in self.urls]
        if len({tls for _, _, tls, _ in found}) > 1:
            raise TransportError(f"broker URLs mix mqtt:// and mqtts://: {self.redacted()}")
        return found

    def _endpoint(self, url: str) -> tuple[str, int, bool, int]:
        try:
            u = urlsplit(url)
            port = u.port
        except ValueError as exc:
            raise TransportError(f"bad broker URL {url!r}: {exc}") from None
        if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not u.hostname:
            raise TransportError(f"bad broker URL {url!r}: use mqtt://host:port or mqtts://host:port")
        tls = u.scheme in ("mqtts", "ssl")
        proto = parse_qs(u.query).get("protocol", [self.protocol])[-1]
        if proto not in _PROTOCOLS:
            raise TransportError(f"bad MQTT protocol {proto!r}: use 5, 3.1.1 or auto")
        return u.hostname, port or (8883 if tls else 1883), tls, _PROTOCOLS[proto]

    def credentials(self) -> tuple[str | None, str | None]:
        u = urlsplit(self.url)
        user = self.username or (unquote(u.username) if u.username else None)
        pw = self.password if self.password is not None else (unquote(u.password) if u.password else None)
        return user, pw

    def redacted(self) -> str:
        return ",".join(_redact(url) for url in self.urls)


def _redact(url: str) -> str:
    u = urlsplit(url)
    return url.replace(f"{u.password}@", "***@") if u.password else url


def clean_start(protocol: int) -> bool | Literal[3]:
    """paho's connect_async clean_start: a fresh session under MQTT 5; paho's default (3, first connect only)
    otherwise, which MQTT 3.1.1 ignores (its clean_session is set on the client)."""
    return True if protocol == 5 else 3
