"""TCP_NODELAY on the artifact channel's MQTT sockets: small requests and PUBACKs must not wait for Nagle.

paho never sets TCP_NODELAY. With Nagle's algorithm a small message (a chunk request, a PUBACK) waits for the
ACK of the previous segment, which the peer delays up to 40 ms: measured here, that made a chunk's round trip
40-60 ms and bound the pull to the window / 50 ms. With TCP_NODELAY on both clients (and `set_tcp_nodelay true`
in mosquitto.conf) a 2 MiB window moves as fast as raw paho. This belongs in transport.mqtt.MqttLink (set in
paho's on_socket_open); until it is there, `tcp_nodelay(link)` applies it from outside, best effort.
"""
from __future__ import annotations

import socket


def _set(sock) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError, ValueError):
        pass  # not TCP (unix socket, websocket wrapper) or already closed


def tcp_nodelay(link) -> bool:
    """Set TCP_NODELAY on an MqttLink or DeviceLink's socket now and on every reconnect; False if not reachable."""
    mqtt = getattr(link, "_mqtt", link)  # DeviceLink wraps an MqttLink
    client = getattr(mqtt, "_client", None)
    if client is None or not hasattr(client, "socket"):
        return False
    previous = getattr(client, "on_socket_open", None)
    if getattr(previous, "_edge_nodelay", False):
        return True
    sock = client.socket()
    if sock is not None:
        _set(sock)

    def on_socket_open(c, userdata, sock):
        _set(sock)
        if previous is not None:
            previous(c, userdata, sock)

    on_socket_open._edge_nodelay = True
    client.on_socket_open = on_socket_open
    return True
