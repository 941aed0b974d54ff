"""The lean clients bench_protocols times: HTTP/1.1 keep-alive with the binary tensor extension (one sendmsg per
request, Content-Length framing) and KServe v2 gRPC through grpcio (bytes in and out, the response parsed with
protobuf)."""

from __future__ import annotations

import json
import socket

import numpy as np


class HttpClient:
    """Keep-alive HTTP/1.1 with the binary tensor extension: one sendmsg per request, Content-Length framing."""

    def __init__(self, port: int, n: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        doc = {
            "inputs": [{"name": "x", "shape": [1, n], "datatype": "FP32", "parameters": {"binary_data_size": 4 * n}}],
            "parameters": {"binary_data_output": True},
        }
        self.json = json.dumps(doc).encode()
        self.buf = bytearray(8 * n + 65536)

    def _exchange(self, head: bytes, *parts) -> bytes:
        self.sock.sendmsg([head, *parts])
        view, got = memoryview(self.buf), 0
        while True:
            got += self.sock.recv_into(view[got:])
            end = self.buf.find(b"\r\n\r\n", 0, got)
            if end >= 0:
                break
        headers = bytes(self.buf[:end]).decode("latin-1").lower()
        length = int(headers.split("content-length:")[1].split("\r\n")[0])
        while got < end + 4 + length:
            got += self.sock.recv_into(view[got:])
        return bytes(self.buf[end + 4 : end + 4 + length]), headers

    def infer(self, x: np.ndarray) -> np.ndarray:
        body_len = len(self.json) + x.nbytes
        head = (
            f"POST /v2/models/relu/infer HTTP/1.1\r\nHost: b\r\nContent-Length: {body_len}\r\n"
            f"Inference-Header-Content-Length: {len(self.json)}\r\n\r\n"
        ).encode()
        body, headers = self._exchange(head + self.json, x)
        hlen = int(headers.split("inference-header-content-length:")[1].split("\r\n")[0])
        return np.frombuffer(body, "<f4", offset=hlen)

    def infer_json(self, doc: bytes) -> bytes:
        head = f"POST /v2/models/relu/infer HTTP/1.1\r\nHost: b\r\nContent-Length: {len(doc)}\r\n\r\n".encode()
        return self._exchange(head, doc)[0]


class GrpcClient:
    def __init__(self, port: int, n: int):
        import grpc

        from agent.serving.proto import oip_pb2 as pb

        self.pb = pb
        opts = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        self.call = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        self.n = n

    def infer(self, x: np.ndarray) -> np.ndarray:
        req = self.pb.ModelInferRequest(model_name="relu")
        req.inputs.add(name="x", datatype="FP32", shape=[1, self.n])
        req.raw_input_contents.append(x.tobytes())
        resp = self.pb.ModelInferResponse.FromString(self.call(req.SerializeToString()))
        return np.frombuffer(resp.raw_output_contents[0], "<f4")

    def shm_request(self) -> bytes:
        req = self.pb.ModelInferRequest(model_name="relu")
        t = req.inputs.add(name="x", datatype="FP32", shape=[1, self.n])
        t.parameters["shared_memory_region"].string_param = "in"
        t.parameters["shared_memory_byte_size"].int64_param = 4 * self.n
        o = req.outputs.add(name="y")
        o.parameters["shared_memory_region"].string_param = "out"
        o.parameters["shared_memory_byte_size"].int64_param = 4 * self.n
        return req.SerializeToString()
