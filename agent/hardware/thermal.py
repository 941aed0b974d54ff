"""Thermal zones and the Raspberry Pi firmware's get_throttled bits."""

from __future__ import annotations

from typing import Any

from agent.hardware.sysroot import Sysroot

THROTTLE_BITS = {
    0: "under_voltage",
    1: "freq_capped",
    2: "throttled",
    3: "soft_temp_limit",
    16: "under_voltage_occurred",
    17: "freq_capped_occurred",
    18: "throttled_occurred",
    19: "soft_temp_limit_occurred",
}
# Zones that are not sensors: Jetson's PMIC-Die always reads 100 C (a fixed trip placeholder).
PLACEHOLDER_ZONES = {"PMIC-Die"}
THROTTLED_GLOBS = (
    "sys/devices/platform/soc/soc:firmware/get_throttled",
    "sys/devices/platform/soc*/soc*:firmware/get_throttled",
    "sys/devices/platform/*/*firmware*/get_throttled",
)


def decode_throttled(text: str) -> dict[str, Any] | None:
    """Decode get_throttled text ('50000', lower-case hex without 0x; '0x50000' accepted) into flags + raw."""
    value_text = text.strip().lower()
    if value_text.startswith("throttled="):
        value_text = value_text.split("=", 1)[1]
    try:
        value = int(value_text, 16)
    except ValueError:
        return None
    if value < 0 or value >= 1 << 32:
        return None
    out: dict[str, Any] = {"raw": f"0x{value:x}"}
    out.update({name: bool(value >> bit & 1) for bit, name in THROTTLE_BITS.items()})
    return out


def read_throttled(sr: Sysroot) -> dict[str, Any] | None:
    for pattern in THROTTLED_GLOBS:
        for rel in sr.glob(pattern):
            text = sr.read_text(rel, what="expected lower-case hex like 50000")
            if text is None:
                return None
            decoded = decode_throttled(text)
            if decoded is None:
                sr.not_understood(rel, "expected lower-case hex like 50000")
            return decoded
    return None


def read_temperatures(sr: Sysroot) -> dict[str, float]:
    """{zone type: degrees C} from /sys/class/thermal/thermal_zone*/{type,temp} (milli-degrees)."""
    temps: dict[str, float] = {}
    zones = sorted(sr.glob("sys/class/thermal/thermal_zone*"), key=lambda z: (len(z), z))
    for zone in zones:
        milli = sr.read_value(f"{zone}/temp", int, "expected milli-degrees C")
        if milli is None:
            continue
        if not -60_000 <= milli <= 200_000:
            sr.note(f"/{zone}/temp: {milli} m°C is outside the physical range; ignored")
            continue
        name = sr.read_text(f"{zone}/type", what="expected a zone name") or zone.rsplit("/", 1)[1]
        if name in PLACEHOLDER_ZONES:
            continue
        key = name if name not in temps else f"{name}.{zone.rsplit('zone', 1)[1]}"
        temps[key] = round(milli / 1000.0, 1)
    return temps


def read_throttling(sr: Sysroot) -> dict[str, Any] | None:
    """Throttle flags where the firmware reports them, plus temperatures; None when neither is known."""
    out = read_throttled(sr) or {}
    temps = read_temperatures(sr)
    if temps:
        out["temperatures_c"] = temps
    return out or None
