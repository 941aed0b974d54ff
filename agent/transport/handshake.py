"""Why an MQTT connection attempt fails, in words: a plain TCP (and TLS) handshake outside paho.

MqttLink asks this when a broker gives no CONNACK: a definitive answer (nothing listening, a TLS refusal) ends
start() early; None means the broker is alive and answered the handshake (a NATS node whose JetStream is not ready
closes the connection before CONNACK, then accepts it a few seconds later), so the link keeps trying."""

from __future__ import annotations

import socket
import ssl

from agent.transport.broker import BrokerConfig


def handshake_failure(broker: BrokerConfig, host: str, port: int, tls: bool, timeout: float = 5.0) -> str | None:
    """A sentence saying why (host, port) refuses a client with `broker`'s TLS files, or None when it accepts."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if tls:
                ctx = ssl.create_default_context(cafile=broker.ca)
                if broker.cert:
                    ctx.load_cert_chain(broker.cert, broker.key)
                with ctx.wrap_socket(sock, server_hostname=host) as conn:
                    conn.settimeout(2)
                    try:
                        conn.recv(1)  # TLS 1.3: a refused client certificate arrives as an alert here
                    except TimeoutError:
                        pass
    except ssl.SSLError as exc:
        return f"TLS handshake failed: {exc.reason or exc}"
    except OSError as exc:
        return f"{exc.strerror or exc} ({host}:{port})"
    return None
