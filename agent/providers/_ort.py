"""ONNX Runtime plumbing for ORT-based providers: EP discovery, plugin libraries, sessions, assignment."""

from __future__ import annotations

import glob
import json
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ProviderError
from agent.providers._bf16 import has_bf16, run_ort_values
from agent.providers._common import SESSION_LOCK, Native, try_import
from agent.providers.base import Assignment, ProviderSession, TensorSpec

_ORT_DTYPES = {
    "float": "float32",
    "float16": "float16",
    "double": "float64",
    "bfloat16": "bfloat16",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "string": "object",
}
# SessionOptions attributes a provider's `options` may set (everything else goes to the EP).
_SESSION_ATTRS = {
    "intra_op_num_threads": int,
    "inter_op_num_threads": int,
    "enable_mem_pattern": bool,
    "enable_cpu_mem_arena": bool,
    "log_severity_level": int,
}
_OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
_PLUGINS: dict[str, tuple[list[Any], str | None]] = {}
_PLUGIN_LOCK = threading.Lock()


def ort() -> Native:
    """The onnxruntime module (imported once) or ProviderError."""
    mod, err = try_import("onnxruntime")
    if mod is None:
        raise ProviderError(f"onnxruntime cannot be imported: {err}")
    return mod


def ort_or_reason() -> tuple[Native, str | None]:
    return try_import("onnxruntime")


def available_providers() -> list[str]:
    mod, _ = try_import("onnxruntime")
    return list(mod.get_available_providers()) if mod is not None else []


def register_plugin(package: str, ep_name: str) -> tuple[list[Any], str | None]:
    """Register a plugin EP library once per process; returns (its OrtEpDevices, error or None)."""
    with _PLUGIN_LOCK:
        if package in _PLUGINS:
            return _PLUGINS[package]
        _PLUGINS[package] = _register(package, ep_name)
        return _PLUGINS[package]


def _register(package: str, ep_name: str) -> tuple[list[Any], str | None]:
    mod, err = try_import(package)
    if mod is None:
        dist = package.replace("_", "-")
        return [], (
            f"{dist} is not installed"
            if err and err.startswith("ModuleNotFoundError")
            else f"{dist} cannot be imported: {err}"
        )
    if not hasattr(mod, "get_library_path"):
        return [], f"{package} has no get_library_path(): not a plugin EP package this agent knows"
    rt, err = ort_or_reason()
    if rt is None:
        return [], f"onnxruntime cannot be imported: {err}"
    if not hasattr(rt, "register_execution_provider_library"):
        return [], f"onnxruntime {rt.__version__} cannot load plugin execution providers (needs >= 1.22)"
    try:
        rt.register_execution_provider_library(ep_name, mod.get_library_path())
    except Exception as exc:  # noqa: BLE001 - native registration failure
        if "already registered" not in str(exc).lower():
            return [], f"registering {package} failed: {exc}"
    return [d for d in rt.get_ep_devices() if d.ep_name == ep_name], None


def dtype_name(ort_type: str) -> str:
    inner = ort_type[len("tensor(") : -1] if ort_type.startswith("tensor(") else ort_type
    return _ORT_DTYPES.get(inner, inner)


def _shape(shape: Iterable[int | str | None]) -> tuple[int | str | None, ...]:
    return tuple(d if isinstance(d, int) else (d or None) for d in shape)


def split_options(options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """options -> (SessionOptions attributes, session config entries, EP provider options)."""
    attrs: dict[str, Any] = {}
    config: dict[str, str] = {}
    ep: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key in _SESSION_ATTRS or key == "graph_optimization_level":
            attrs[key] = value
        elif key.startswith(("session.", "ep.")):
            config[key] = str(int(value)) if isinstance(value, bool) else str(value)
        else:
            ep[key] = value
    return attrs, config, ep


def session_options(attrs: dict[str, Any], config: dict[str, str], profile_dir: str | None = None) -> Native:
    rt = ort()
    so = rt.SessionOptions()
    so.log_severity_level = 4  # failures come back as ProviderError with ORT's message; no duplicate log lines
    for key, value in attrs.items():
        if key == "graph_optimization_level":
            if str(value) not in _OPT_LEVELS:
                raise ProviderError(f"graph_optimization_level must be one of {', '.join(_OPT_LEVELS)}, not {value!r}")
            so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, _OPT_LEVELS[str(value)])
        else:
            try:
                setattr(so, key, _SESSION_ATTRS[key](value))
            except (TypeError, ValueError) as exc:
                raise ProviderError(f"session option {key}={value!r}: {exc}") from exc
    # The intra-op pool stops spinning when a run ends (it still spins inside the run). Otherwise its threads
    # spin on for tens of ms after each run: CPU burnt for nothing on a device, and counted in the compute time
    # of a run measured after it (docs/serving.md, "Compute time"). A target or manifest may set it to 0.
    for key, value in {"session.force_spinning_stop": "1", **config}.items():
        so.add_session_config_entry(key, value)
    if profile_dir is None:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    else:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort")
    return so


def can_record_assignment() -> bool:
    rt = ort()
    return hasattr(rt.InferenceSession, "get_provider_graph_assignment_info")


def open_ort_session(
    model_path: str | Path,
    *,
    provider: str,
    ep_name: str,
    ep_options: dict[str, Any] | None = None,
    attrs: dict[str, Any] | None = None,
    config: dict[str, str] | None = None,
    ep_devices: list[Any] | None = None,
    precision: str | None = None,
    device: str | None = None,
) -> "OrtSession":
    """Create an InferenceSession on one EP (no silent CPU fallback for non-CPU EPs) and wrap it."""
    rt = ort()
    path = Path(model_path)
    if not path.is_file():
        raise ProviderError(f"{provider}: model file not found: {path}")
    config = dict(config or {})
    if ep_name != "CPUExecutionProvider":
        config.setdefault("session.disable_cpu_ep_fallback", "1")
    profile_dir = None if can_record_assignment() else tempfile.mkdtemp(prefix="edge-agent-ortprof-")
    so = session_options(attrs or {}, config, profile_dir)
    ep_opts = {k: _opt_str(v) for k, v in (ep_options or {}).items()}
    started = time.perf_counter()
    with SESSION_LOCK:
        try:
            if ep_devices is not None:
                so.add_provider_for_devices(ep_devices, ep_opts)
                sess = rt.InferenceSession(str(path), sess_options=so)
            else:
                sess = rt.InferenceSession(str(path), sess_options=so, providers=[(ep_name, ep_opts)])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise ProviderError(f"{provider}: onnxruntime could not create a session: {_msg(exc)}") from exc
    compile_s = time.perf_counter() - started
    return OrtSession(
        sess,
        provider=provider,
        ep_name=ep_name,
        precision=precision,
        device=device,
        compile_s=compile_s,
        profile_dir=profile_dir,
    )


def _opt_str(value: Any) -> str:
    """EP option values are strings; bools become 'True'/'False', as ORT's own Python binding sends them."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _msg(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class OrtSession(ProviderSession):
    """An onnxruntime InferenceSession behind the provider contract (InferenceSession.run is thread-safe)."""

    def __init__(
        self,
        sess: Native,
        *,
        provider: str,
        ep_name: str,
        precision: str | None,
        device: str | None,
        compile_s: float,
        profile_dir: str | None,
    ) -> None:
        self._sess = sess
        self._ep = ep_name
        self._profile_dir = profile_dir
        self._assignment: Assignment | None = None
        self._ran = False  # has run() succeeded once (the profiling trace needs a run)
        self.provider = provider
        self.precision = precision
        self.device = device
        self.compile_s = compile_s
        self.inputs = [TensorSpec(i.name, dtype_name(i.type), _shape(i.shape)) for i in sess.get_inputs()]
        self.outputs = [TensorSpec(o.name, dtype_name(o.type), _shape(o.shape)) for o in sess.get_outputs()]
        self._bf16 = has_bf16(self.inputs) or has_bf16(self.outputs)  # numpy has no bfloat16: OrtValues instead
        self._names = [o.name for o in self.outputs]
        self._n_inputs = len(self.inputs)
        # The binding's own run: InferenceSession.run adds ~20 us of Python per call (a required-input check the
        # serving path has already made, and a silent re-creation on other providers after an EP failure,
        # which a qualified deployment must never do). Public run() where the binding is not exposed.
        native = getattr(sess, "_sess", None)
        self._native_run = native.run if native is not None and hasattr(native, "run") else None
        self._native = native if native is not None and hasattr(native, "run_with_iobinding") else None
        self._bindings: dict[tuple[Any, ...], Any] = {}  # (thread, pointers, shapes) -> its IOBinding (run_into)

    def run(self, feeds: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = list(output_names) if output_names else self._names
        sess, native = self._sess, self._native_run
        if sess is None:
            raise ProviderError(f"{self.provider}: the session is closed")
        try:
            if self._bf16:
                values = run_ort_values(ort(), sess, names, feeds)
            elif native is not None and len(feeds) == self._n_inputs:  # else the public run names what is missing
                values = native(names, feeds, None)
            else:
                values = sess.run(names, feeds)
        except Exception as exc:  # noqa: BLE001
            raise ProviderError(f"{self.provider}: inference failed: {_msg(exc)}") from exc
        self._ran = True
        return dict(zip(names, values))

    def run_into(self, feeds: dict[str, np.ndarray], into: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs written by the runtime straight into `into` (IOBinding over the arrays' memory, no copy).
        Bindings hold pointers and shapes only, so one is reused while a thread binds the same memory again (a
        client's shared-memory windows): binding costs ~20 us a call, about what the run of a 1 MiB Relu does."""
        native = self._native
        if native is None or self._bf16 or len(feeds) != self._n_inputs:
            return super().run_into(feeds, into)
        feeds = {k: v if v.flags.c_contiguous else np.ascontiguousarray(v) for k, v in feeds.items()}
        key = (
            threading.get_ident(),
            *((k, v.__array_interface__["data"][0], v.dtype.str, v.shape) for k, v in feeds.items()),
            *((k, v.__array_interface__["data"][0], v.dtype.str, v.shape) for k, v in into.items()),
        )
        try:
            binding = self._bindings.get(key)
            if binding is None:
                rt = ort().capi._pybind_state
                cpu = rt.OrtDevice(rt.OrtDevice.cpu(), rt.OrtDevice.default_memory(), 0)
                binding = rt.SessionIOBinding(native)
                for k, v in feeds.items():
                    binding.bind_input(k, cpu, v.dtype, list(v.shape), v.__array_interface__["data"][0])
                for k, v in into.items():
                    binding.bind_output(k, cpu, v.dtype, list(v.shape), v.__array_interface__["data"][0])
                if len(self._bindings) >= 64:
                    self._bindings.clear()
                self._bindings[key] = binding
            native.run_with_iobinding(binding, None)
        except Exception as exc:  # noqa: BLE001
            raise ProviderError(f"{self.provider}: inference failed: {_msg(exc)}") from exc
        self._ran = True
        return into

    def assignment(self) -> Assignment:
        if self._assignment is None:
            if self._profile_dir is None:
                self._assignment = graph_assignment(self._sess, self._ep)
            else:
                self._assignment = self._profiled_assignment()
        return self._assignment

    def _profiled_assignment(self) -> Assignment:
        if not self._ran:
            self.run(zero_feeds(self.inputs))
        path = self._sess.end_profiling()
        try:
            events = json.loads(Path(path).read_text())
        finally:
            assert self._profile_dir is not None  # only profiled sessions get here (assignment())
            for f in glob.glob(os.path.join(self._profile_dir, "*")):
                os.unlink(f)
        return profiled_assignment(events, self._ep)

    def close(self) -> None:
        self._bindings.clear()  # before the session they point into
        self._sess = None
        self._native_run = None
        self._native = None


def graph_assignment(sess: Native, ep_name: str) -> Assignment:
    """Node -> EP from ORT's recorded graph assignment (post-optimisation nodes)."""
    on, other = 0, Counter[str]()
    for sub in sess.get_provider_graph_assignment_info():
        nodes = list(sub.get_nodes())
        if sub.ep_name == ep_name:
            on += len(nodes)
        else:
            other.update(n.op_type for n in nodes)
    total = on + sum(other.values())
    return Assignment(
        nodes_total=total,
        nodes_on_provider=on,
        fallback_ops=tuple(sorted(other)),
        method="ort-graph-assignment",
        devices=(ep_name,),
    )


def profiled_assignment(events: list[dict[str, Any]], ep_name: str) -> Assignment:
    """Node -> EP from a profiling trace: node events carry args.provider."""
    seen: dict[str, tuple[str, str]] = {}
    for ev in events:
        args = ev.get("args") or {}
        if ev.get("cat") == "Node" and "provider" in args:
            node = str(ev.get("name", "")).rsplit("_kernel_time", 1)[0]
            seen[node] = (args["provider"], args.get("op_name", "?"))
    on = sum(1 for p, _ in seen.values() if p == ep_name)
    other = sorted({op for p, op in seen.values() if p != ep_name})
    return Assignment(
        nodes_total=len(seen) or None,
        nodes_on_provider=on if seen else None,
        fallback_ops=tuple(other),
        method="ort-profiling",
        devices=(ep_name,),
    )


def zero_feeds(specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Zero inputs with dynamic dimensions set to 1 (used only to trigger a profiled run)."""
    feeds = {}
    for s in specs:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in s.shape)
        feeds[s.name] = np.zeros(shape, dtype=np.dtype(s.dtype) if s.dtype != "bfloat16" else np.float32)
    return feeds
