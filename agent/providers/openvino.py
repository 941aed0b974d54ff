"""The `openvino` provider: the native OpenVINO runtime (devices CPU, GPU, NPU), precision made explicit."""

from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.errors import ProviderError
from agent.providers._common import (
    SESSION_LOCK,
    Native,
    has_arm_fp16,
    has_bf16,
    probe_guard,
    try_import,
    unavailable,
)
from agent.providers.base import Assignment, ProbeResult, Provider, ProviderSession, TensorSpec

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

PRECISIONS = {"f32": "f32", "bf16": "bf16", "f16": "f16", "fp32": "f32", "fp16": "f16"}
_SKIP_EXEC = {"Parameter", "Result", "Constant"}
_CORE: list[Any] = []
_CORE_LOCK = threading.Lock()


def _ov() -> Native:
    mod, err = try_import("openvino")
    if mod is None:
        raise ProviderError(f"openvino: the openvino runtime cannot be imported: {err} (pip install openvino)")
    return mod


def _core() -> Native:
    """One ov.Core per process (creating it loads plugins); its own lock so probes never wait on a compile."""
    with _CORE_LOCK:
        if not _CORE:
            _CORE.append(_ov().Core())
        return _CORE[0]


def profile_devices(profile: "HardwareProfile") -> list[str]:
    """OpenVINO devices this hardware has: CPU, plus Intel GPU / NPU accelerators."""
    devices = ["CPU"]
    if profile.has_accelerator("gpu", "intel"):
        devices.append("GPU")
    if profile.has_accelerator("npu", "intel"):
        devices.append("NPU")
    return devices


def members(device: str) -> list[str]:
    """The devices a device string names: CPU -> [CPU]; HETERO:GPU,CPU -> [GPU, CPU]; AUTO (no list) -> []."""
    head, _, rest = device.partition(":")
    if head in ("HETERO", "AUTO", "MULTI"):
        return [d.strip() for d in rest.split(",") if d.strip()]
    return [device]


def unsupported_ops(message: str) -> list[str]:
    """Op names from OpenVINO's 'No conversion rule found for operations: a, b' (or similar) report."""
    ops: list[str] = []
    for m in re.finditer(r"(?:No conversion rule found for operations|not supported[^:\n]*):\s*([^\n]+)", message):
        ops += [o.strip() for o in m.group(1).split(",") if o.strip()]
    return list(dict.fromkeys(ops))


def precision_name(ov_type: Any) -> str:
    name = ov_type.get_type_name() if hasattr(ov_type, "get_type_name") else str(ov_type)
    return {"bf16": "bf16", "f32": "f32", "f16": "f16"}.get(name, name)


class OpenVINOProvider(Provider):
    name = "openvino"
    runtime = "openvino"

    def probe(self, profile: "HardwareProfile", options: dict[str, Any] | None = None) -> ProbeResult:
        return probe_guard(self.name, self._probe, profile, options)

    def _probe(self, profile: "HardwareProfile", options: dict[str, Any] | None) -> ProbeResult:
        if profile.arch not in ("x86_64", "aarch64"):
            return unavailable(
                self.name,
                f"OpenVINO needs an x86_64 or aarch64 CPU; this profile's arch is {profile.arch or 'unknown'}",
                "use the cpu provider",
            )
        ov, err = try_import("openvino")
        if ov is None:
            return unavailable(self.name, f"the openvino runtime is not installed ({err})", "pip install openvino")
        version = ov.get_version().split("-")[0]
        host = list(_core().available_devices)
        devices = profile_devices(profile)
        wanted = [str(d).upper() for d in (options or {}).get("devices") or []]
        if wanted:
            devices = [d for d in wanted if set(members(d)) <= set(devices)]  # HETERO:GPU,CPU: all of them
            if not devices:
                return unavailable(
                    self.name,
                    f"none of the target's OpenVINO devices ({', '.join(wanted)}) is in this "
                    f"profile (it has {', '.join(profile_devices(profile))})",
                    "add CPU to the target's openvino devices, or use cpu",
                    options=dict(options or {}),
                )
        why = f"openvino {version}; devices {', '.join(devices)}"
        if has_bf16(profile):
            why += "; CPU default precision bf16 (f32 on request)"
        elif has_arm_fp16(profile):
            why += "; CPU default precision f16 (f32 on request)"
        if set(devices) - set(host):
            why += f" (the runtime on this host sees {', '.join(host) or 'no device'})"
        return ProbeResult(
            name=self.name,
            available=True,
            reason=why,
            devices=tuple(devices),
            options=dict(options or {}),
            versions={"openvino": version},
        )

    def precisions(self, profile: "HardwareProfile") -> list[str | None]:
        reduced = has_bf16(profile) or has_arm_fp16(profile) or profile.has_accelerator("gpu", "intel")
        return [None, "f32"] if reduced else [None]  # GPU plugin defaults to f16, bf16/fp16 CPUs to bf16/f16

    def open_session(
        self,
        model_path: str | Path,
        *,
        options: dict[str, Any] | None = None,
        precision: str | None = None,
        device: str | None = None,
        cache_dir: str | Path | None = None,
    ) -> ProviderSession:
        path = Path(model_path)
        if not path.is_file():
            raise ProviderError(f"openvino: model file not found: {path}")
        config, preferred = split_options(options)
        if precision is not None:
            if precision not in PRECISIONS:
                raise ProviderError(f"openvino: unknown precision {precision!r}; use one of f32, bf16, f16")
            config["INFERENCE_PRECISION_HINT"] = PRECISIONS[precision]
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            config["CACHE_DIR"] = str(cache_dir)
        started = time.perf_counter()
        with SESSION_LOCK:
            core = _core()
            dev = device or _first_available(core, preferred)
            _check_device(core, dev)
            try:
                model = _read_model(core, path)
            except Exception as exc:  # noqa: BLE001 - OpenVINO raises its own types with the frontend's report
                raise _with_coverage(_compile_error(exc, f"could not load {path.name}"), core, path, dev) from exc
            try:
                compiled = core.compile_model(model, dev, config)
            except Exception as exc:  # noqa: BLE001
                raise _compile_error(exc, f"compile_model on {dev} failed") from exc
        return OpenVINOSession(compiled, path, device=dev, compile_s=time.perf_counter() - started)


def split_options(options: dict[str, Any] | None) -> tuple[dict[str, str], list[str]]:
    """Target options -> (OpenVINO properties, preferred devices). `performance_hint` -> PERFORMANCE_HINT."""
    config: dict[str, str] = {}
    preferred: list[str] = []
    for key, value in (options or {}).items():
        if key == "devices":
            preferred = [str(d).upper() for d in (value if isinstance(value, (list, tuple)) else [value])]
        else:
            config[str(key).upper()] = _prop(value)
    return config, preferred


def _first_available(core: Native, preferred: list[str]) -> str:
    """The first preferred device the runtime sees (CPU when none is given)."""
    seen = {d.split(".")[0] for d in core.available_devices}
    return next((d for d in preferred if d.split(".")[0] in seen), preferred[0] if preferred else "CPU")


def _onnx_io_names(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """The ONNX graph's input names and output names (without loading weights); empty if unreadable."""
    try:
        import onnx

        g = onnx.load(str(path), load_external_data=False).graph
        return frozenset(v.name for v in g.input), frozenset(v.name for v in g.output)
    except Exception:  # noqa: BLE001 - names are a preference, not a requirement
        return frozenset(), frozenset()


def _read_model(core: Native, path: Path) -> Native:
    """ONNX files go through the ONNX frontend only (read_model would try every frontend on a bad file)."""
    if path.suffix.lower() != ".onnx":
        return core.read_model(str(path))
    from openvino.frontend import FrontEndManager

    fe = FrontEndManager().load_by_framework("onnx")
    return fe.convert(fe.load(str(path)))


def _check_device(core: Native, device: str) -> None:
    base = device.split(".")[0].split(":")[0]
    if base in ("AUTO", "HETERO", "MULTI", "BATCH"):
        return
    seen = list(core.available_devices)
    if device not in seen and base not in {d.split(".")[0] for d in seen}:
        raise ProviderError(
            f"openvino: device {device} is not available here; OpenVINO sees: {', '.join(seen) or 'none'}"
        )


def _with_coverage(err: ProviderError, core: Native, path: Path, device: str) -> ProviderError:
    """A graph OpenVINO converts only in part: what each device would take, measured on the converted rest."""
    if path.suffix.lower() == ".onnx" and unsupported_op_names(str(err)):
        from agent.providers import ov_coverage

        err.assignment = ov_coverage.measure_partial(core, path, device)  # type: ignore[attr-defined]
    return err


def unsupported_op_names(message: str) -> list[str]:
    m = re.search(r"unsupported operator\(s\) ([^:]+):", message)
    return [o.strip() for o in m.group(1).split(",")] if m else []


def _prop(value: Any) -> str:
    if isinstance(value, bool):
        return "YES" if value else "NO"
    return str(value)


def _compile_error(exc: BaseException, what: str) -> ProviderError:
    text = str(exc)
    ops = unsupported_ops(text)
    if ops:
        return ProviderError(
            f"openvino: unsupported operator(s) {', '.join(ops)}: OpenVINO's ONNX frontend has no "
            f"conversion rule for them; use a provider that runs them, e.g. cpu"
        )
    lines = [
        ln.strip()
        for ln in text.splitlines()
        if ln.strip() and not ln.startswith(("Exception from", "Check '", "FrontEnd API failed"))
    ]
    return ProviderError(f"openvino: {what}: {' '.join(lines) or type(exc).__name__}")


class OpenVINOSession(ProviderSession):
    """A compiled OpenVINO model; a pool of infer requests makes run() safe from several threads."""

    provider = "openvino"

    def __init__(self, compiled: Native, model_path: Path, *, device: str, compile_s: float) -> None:
        self._compiled = compiled
        self._model_path = model_path
        self._pool: queue.SimpleQueue[Native] = queue.SimpleQueue()
        self.device = device
        self.compile_s = compile_s
        self.precision = self._precision()
        graph_inputs, graph_outputs = _onnx_io_names(model_path)
        self._folded = graph_inputs  # ONNX inputs OpenVINO may drop (CastLike's `like`, an empty `axes`)
        self.inputs = [self._spec(p, graph_inputs) for p in compiled.inputs]
        self.outputs = [self._spec(p, graph_outputs) for p in compiled.outputs]
        self._in_index = {s.name: i for i, s in enumerate(self.inputs)}
        self._assignment: Assignment | None = None

    def _precision(self) -> str | None:
        try:
            return precision_name(self._compiled.get_property("INFERENCE_PRECISION_HINT"))
        except Exception:  # noqa: BLE001 - some devices do not expose it
            return None

    @staticmethod
    def _spec(port: Native, graph_names: frozenset[str] = frozenset()) -> TensorSpec:
        # A port can carry several tensor names (internal aliases too): prefer the ONNX graph's own name.
        names = sorted(port.get_names())
        onnx_names = [n for n in names if n in graph_names]
        name = onnx_names[0] if onnx_names else (port.get_any_name() if names else "")
        shape = tuple(d.get_length() if d.is_static else None for d in port.get_partial_shape())
        et = port.get_element_type()  # to_dtype() maps bf16 to float16: name it, as the graph does
        return TensorSpec(name, "bfloat16" if et.get_type_name() == "bf16" else np.dtype(et.to_dtype()).name, shape)

    def run(self, feeds: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        if self._compiled is None:
            raise ProviderError("openvino: the session is closed")
        unknown = set(feeds) - set(self._in_index)
        if unknown and unknown <= self._folded and set(self._in_index) <= set(feeds):
            feeds, unknown = {k: v for k, v in feeds.items() if k in self._in_index}, set()
        if unknown:
            raise ProviderError(
                f"openvino: unknown input(s) {', '.join(sorted(unknown))}; model inputs: {', '.join(self._in_index)}"
            )
        try:
            req = self._pool.get_nowait()
        except queue.Empty:
            req = self._compiled.create_infer_request()
        try:
            ports = self._compiled.inputs
            req.infer({self._in_index[k]: _in_tensor(ports[self._in_index[k]], v) for k, v in feeds.items()})
            wanted = output_names or [o.name for o in self.outputs]
            index = {o.name: i for i, o in enumerate(self.outputs)}
            return {n: _out_array(req.get_output_tensor(index[n])) for n in wanted}
        except KeyError as exc:
            raise ProviderError(f"openvino: unknown output {exc.args[0]!r}") from exc
        except Exception as exc:  # noqa: BLE001
            raise ProviderError(f"openvino: inference failed: {' '.join(str(exc).split())}") from exc
        finally:
            self._pool.put(req)

    def assignment(self) -> Assignment:
        if self._assignment is None:
            self._assignment = self._measure()
        return self._assignment

    def _measure(self) -> Assignment:
        """Measured, not inferred: query_model on the session's device string (per-device node counts, split
        devices such as HETERO:GPU,CPU or AUTO included) and the compiled runtime graph (what ran)."""
        from dataclasses import replace

        from agent.providers import ov_coverage

        devices = tuple(str(d) for d in self._compiled.get_property("EXECUTION_DEVICES"))
        core = _core()
        try:
            model = _read_model(core, self._model_path)
        except Exception as exc:  # noqa: BLE001
            return replace(ov_coverage.not_measured(f"could not re-read the model: {exc}"), devices=devices)
        return replace(
            ov_coverage.measure(core, model, self._compiled, self.device or "CPU", self._model_path), devices=devices
        )

    def runtime_precisions(self) -> dict[str, int]:
        """Executable nodes per runtime precision from the exec graph (e.g. {'bf16': 9, 'f32': 6})."""
        counts: dict[str, int] = {}
        for op in self._compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if op.get_type_name() in _SKIP_EXEC or "runtimePrecision" not in info:
                continue
            p = str(info["runtimePrecision"].astype(str)).lower()
            counts[p] = counts.get(p, 0) + 1
        return counts

    def close(self) -> None:
        self._pool = queue.SimpleQueue()
        self._compiled = None


def _in_tensor(port: Native, value: np.ndarray) -> Native:
    """A numpy feed for one input port; 4-bit types (i4, u4, f4e2m1) are packed two values per byte as OpenVINO
    expects (numpy/ml_dtypes hold one value per byte)."""
    et = port.get_element_type()
    if et.get_type_name() == "bf16":  # OpenVINO's numpy bridge misreads ml_dtypes.bfloat16: hand it the bits
        import ml_dtypes

        arr = np.ascontiguousarray(np.asarray(value).astype(ml_dtypes.bfloat16))
        return _ov().Tensor(arr.view(np.uint16), _ov().Shape(list(arr.shape)), et)
    if et.bitwidth != 4:
        return np.asarray(value, order="C")
    arr = np.asarray(value)
    codes = arr.view(np.uint8).ravel() & 0x0F
    if codes.size % 2:
        codes = np.append(codes, np.uint8(0))
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    return _ov().Tensor(packed, _ov().Shape(list(arr.shape)), et)


def _out_array(tensor: Native) -> np.ndarray:
    """An output tensor as numpy; 4-bit outputs are unpacked to one value per byte (ml_dtypes int4/uint4/float4)."""
    et = tensor.element_type
    if et.get_type_name() == "bf16":  # .data is a float16 view of the bf16 bits
        import ml_dtypes

        bf16: np.ndarray = np.asarray(tensor.data).view(np.uint16).view(np.dtype(ml_dtypes.bfloat16)).copy()
        return bf16
    if et.bitwidth != 4:
        return np.array(tensor.data, copy=True)
    shape = tuple(tensor.shape)
    raw = np.asarray(tensor.data).view(np.uint8).ravel()
    codes = np.stack([raw & 0x0F, raw >> 4], axis=1).ravel()[: int(np.prod(shape, dtype=np.int64))]
    import ml_dtypes

    name = et.get_type_name()
    if name == "i4":
        return (((codes.astype(np.int8) ^ 8) - 8).astype(np.dtype(ml_dtypes.int4))).reshape(shape)
    if name == "u4":
        return codes.astype(np.dtype(ml_dtypes.uint4)).reshape(shape)
    f4: np.ndarray = codes.astype(np.uint8).view(np.dtype(ml_dtypes.float4_e2m1fn)).reshape(shape)
    return f4
