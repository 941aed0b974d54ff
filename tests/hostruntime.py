"""What the installed runtimes report on this host: tests derive their expectations from it, never from the CPU vendor."""

from __future__ import annotations

import functools


@functools.cache
def ort_openvino_devices() -> tuple[str, ...]:
    """Device types the onnxruntime-ep-openvino plugin enumerates here (empty on non-Intel hosts or without it)."""
    from agent.providers import _ort
    from agent.providers.ort_openvino import EP, PLUGIN

    devs, _err = _ort.register_plugin(PLUGIN, EP)
    return tuple(str(d.device.type).rsplit(".", 1)[-1].upper() for d in devs)
