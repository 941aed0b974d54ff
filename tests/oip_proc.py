"""An OIPServer in a child process (its RSS measured apart from the test's), with probes for the attack tests."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _identity_fp32():
    from onnx import TensorProto, helper
    from support.serving import _model

    vi = helper.make_tensor_value_info
    return _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, ["n"])],
        [vi("y", TensorProto.FLOAT, ["n"])],
    )


def _image_pool():
    """img: x FP32 [1,3,224,224] (an image classifier's input) -> GlobalAveragePool -> y [1,3,1,1]."""
    from onnx import TensorProto, helper
    from support.serving import _model

    vi = helper.make_tensor_value_info
    return _model(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, [1, 3, 224, 224])],
        [vi("y", TensorProto.FLOAT, [1, 3, 1, 1])],
    )


def _main(kwargs: dict) -> None:
    """Child: serve tiny (FP32 [1,4]), ids (identity of every datatype, all inputs needed), id32 (FP32
    identity, x -> y) and img (FP32 [1,3,224,224] averaged per channel) until stdin closes."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    from support.serving import identity_all_types_model, open_session

    from agent.samples import tiny_model
    from agent.serving.http.server import OIPServer
    from agent.serving.memory import fix_mmap_threshold, limit_malloc_arenas
    from agent.serving.registry import ModelRegistry

    limit_malloc_arenas(2)  # as the daemon does
    fix_mmap_threshold()
    d = Path(tempfile.mkdtemp(prefix="oip-proc-"))
    reg = ModelRegistry()
    reg.activate("tiny", "1", open_session(tiny_model(1.0), d, "tiny.onnx"))
    reg.activate("ids", "1", open_session(identity_all_types_model(), d, "ids.onnx"))
    reg.activate("id32", "1", open_session(_identity_fp32(), d, "id32.onnx"))
    reg.activate("img", "1", open_session(_image_pool(), d, "img.onnx"))
    grpc_opts = kwargs.pop("grpc", None)  # {} or GRPCServer keyword arguments: serve gRPC beside HTTP
    srv = OIPServer(reg, port=0, **kwargs).start()
    gsrv = None
    if grpc_opts is not None:
        from agent.serving.grpc.front import GRPCServer

        gsrv = GRPCServer(srv.plane, port=0, **grpc_opts).start()
    print(json.dumps({"port": srv.port, "grpc_port": gsrv.port if gsrv else None}), flush=True)
    sys.stdin.read()
    if gsrv is not None:
        gsrv.shutdown(5)
    srv.shutdown(5)
    reg.close()


def rss(pid: int) -> int:
    """Resident set size of a process in bytes."""
    from support.proc import status_bytes

    return status_bytes(pid, "VmRSS")


class Served:
    """The child's port and pid, its RSS peak and the slowest /v2/health/live answer while watched."""

    def __init__(self, port: int, pid: int, grpc_port: int | None = None):
        self.port, self.pid, self.grpc_port = port, pid, grpc_port
        self.rss0 = rss(pid)
        self.rss_peak = self.rss0
        self.live_worst = 0.0
        self.live_failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._rss, daemon=True),
            threading.Thread(target=self._live, daemon=True),
        ]

    def _rss(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.rss_peak = max(self.rss_peak, rss(self.pid))
            except (OSError, RuntimeError):
                return

    def _live(self) -> None:
        while not self._stop.wait(0.1):
            t0 = time.monotonic()
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                c.request("GET", "/v2/health/live")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status != 200:
                    self.live_failures.append(f"status {r.status}")
            except (OSError, http.client.HTTPException) as exc:
                self.live_failures.append(repr(exc))
            self.live_worst = max(self.live_worst, time.monotonic() - t0)

    def watch(self) -> "Served":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.ident is not None:
                t.join(15)


@contextlib.contextmanager
def served(**kwargs):
    """Start the child server with OIPServer keyword arguments; yields a Served (not yet watching)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    code = f"import json, oip_proc; oip_proc._main(json.loads({json.dumps(json.dumps(kwargs))}))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server process exited with {proc.wait(30)}")
        info = json.loads(line)
        s = Served(info["port"], proc.pid, info.get("grpc_port"))
        yield s
        s.stop()
    finally:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
