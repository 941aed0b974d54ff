"""grpcio's own floor for bench_protocols: a bare grpcio sync server (the same pool size and HTTP/2 options as the
daemon's gRPC front, no model, none of our code) that echoes each request's bytes, and a client that sends the
input's bytes and reads the answer's. Its throughput beside ours says how much of the gap to HTTP binary is the
gRPC transport itself."""

from __future__ import annotations

from concurrent import futures

import numpy as np

METHOD = "/floor.Echo/Echo"


def serve_echo(ports, stop) -> None:
    import grpc

    options = [
        ("grpc.max_receive_message_length", 1 << 30),
        ("grpc.max_send_message_length", 1 << 30),
        ("grpc.max_concurrent_streams", 16),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options, maximum_concurrent_rpcs=64)
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Echo", {"Echo": echo}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ports.put(port)
    stop.wait()
    server.stop(1).wait(2)


class EchoClient:
    def __init__(self, port: int, n: int):
        import grpc

        opts = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        self.call = self.channel.unary_unary(METHOD)

    def infer(self, x: np.ndarray) -> np.ndarray:
        return np.frombuffer(self.call(x.tobytes()), "<f4")
