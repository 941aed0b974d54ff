"""Simulated device classes: captured sysroots -> hardware profile, target, and the providers this host can
really run on that hardware's behalf; plus the per-process qualification cache identical devices share."""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import sysroots as captures
from agent.errors import ConfigError


def discover_sysroots(base: str | os.PathLike[str] | None = None) -> list[str]:
    """Every captured sysroot under `base` (default: the captures shipped in the package, agent/sysroots)."""
    root = Path(base) if base else captures.root()
    found = (
        sorted(str(p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
        if root.is_dir()
        else []
    )
    if not found:
        raise ConfigError(f"no captured sysroots under {root}: pass --sysroots DIR,DIR (each a captured / tree)")
    return found


def resolve_sysroots(spec: str | None) -> list[str] | None:
    """'a,b' -> directories; a bare name that is not a directory is looked up among the shipped captures."""
    if not spec:
        return None
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if not Path(item).is_dir() and item in captures.names():
            item = str(captures.path(item))
        out.append(item)
    return out or None


def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@dataclass(frozen=True)
class DeviceClass:
    """One kind of simulated device. `providers` is what qualification may use here; `why` explains each drop."""

    name: str
    sysroot: str
    profile: Any
    target: str
    providers: tuple[str, ...]
    why: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.name,
            "sysroot": self.sysroot,
            "target": self.target,
            "arch": self.profile.arch,
            "providers": list(self.providers),
            "dropped": dict(self.why),
        }


def simulated_providers(profile: Any, target: Any) -> tuple[tuple[str, ...], dict[str, str]]:
    """The target's providers that this host can stand in for, in the target's order.

    A provider is kept when its real probe (host runtime, simulated hardware profile) says available. On a device
    class of another CPU architecture only `cpu` is kept: ONNX Runtime's CPU provider computes the same fp32
    graph everywhere up to summation order, while an accelerator's numerics (fp16 HTP, TensorRT, bf16 kernels)
    cannot be reproduced by this host's runtimes, so claiming them would fake success."""
    from agent import providers as registry

    kept, why = [], {}
    cross = profile.arch != host_arch()
    for pref in target.providers:
        if cross and pref.name != "cpu":
            why[pref.name] = f"simulated {profile.arch} device on a {host_arch()} host: only cpu numerics are real here"
            continue
        try:
            probe = registry.get(pref.name).probe(profile, dict(pref.options))
        except Exception as exc:  # noqa: BLE001 - a broken provider module is a dropped provider, with its reason
            why[pref.name] = f"probe failed: {exc}"
            continue
        if probe.available:
            kept.append(pref.name)
        else:
            why[pref.name] = probe.reason
    if "cpu" not in kept and "cpu" not in why:
        kept.append("cpu")  # the reference provider is always present on a real device
    return tuple(kept), why


def load_classes(sysroots: list[str], strict: bool = True) -> list[DeviceClass]:
    """Detect each sysroot once (never reading the host) and match its target. A sysroot where no CPU
    architecture can be read is not a device capture: an error when named (strict), skipped when discovered."""
    from agent.targets import detect_device, match

    out = []
    for root in sysroots:
        if not Path(root).is_dir():
            raise ConfigError(f"--sysroots: {root} is not a directory")
        profile = detect_device(root, use_host_tools=False)
        if profile.arch is None:
            if strict:
                raise ConfigError(
                    f"--sysroots: no CPU architecture readable under {root} (proc/cpuinfo, "
                    "uname captures): not a captured device"
                )
            continue
        target = match(profile)
        providers, why = simulated_providers(profile, target)
        out.append(DeviceClass(Path(root).name, str(root), profile, target.name, providers, why))
    if not out:
        raise ConfigError(f"none of {len(sysroots)} sysroots is a captured device")
    return out


class QualificationCache:
    """Per-process memo of qualification results keyed by (artifact sha256, target, provider set).

    Identical simulated devices (same target, same providers, same host) would measure the same thing; the
    first one measures for real, the others wait for it and reuse the result (counted in `stats`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[Any, ...], Any] = {}
        self._busy: dict[tuple[Any, ...], threading.Lock] = {}
        self._first: dict[tuple[Any, ...], str] = {}
        self.measured = 0
        self.reused = 0

    def get(
        self,
        key: tuple[Any, ...],
        device_id: str,
        compute: Callable[[], Any],
        on_reuse: Callable[[str], None] | None = None,
        check: Callable[[], None] | None = None,
    ) -> Any:
        """`check` (the waiting deployment's StepContext.check) is called every half second while another device
        measures: a cancel or the state's deadline reaches a device that waits, not only the one measuring."""
        with self._lock:
            lock = self._busy.setdefault(key, threading.Lock())
        while not lock.acquire(timeout=0.5):
            if check is not None:
                check()
        try:
            with self._lock:
                if key in self._done:
                    self.reused += 1
                    if on_reuse:
                        on_reuse(self._first[key])
                    return self._done[key]
            value = compute()  # an exception is not cached: the next device measures again
            with self._lock:
                self._done[key] = value
                self._first[key] = device_id
                self.measured += 1
            return value
        finally:
            lock.release()

    def stats(self) -> dict[str, int]:
        return {"measured": self.measured, "reused": self.reused}
