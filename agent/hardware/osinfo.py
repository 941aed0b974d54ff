"""Operating system and firmware identity: /etc/os-release and DMI (/sys/class/dmi/id)."""

from __future__ import annotations

import shlex

from agent.hardware.sysroot import Sysroot

DMI_PLACEHOLDERS = {
    "",
    "to be filled by o.e.m.",
    "default string",
    "system product name",
    "not applicable",
    "none",
    "unknown",
    "system manufacturer",
    "o.e.m.",
}


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        try:
            parts = shlex.split(value)
        except ValueError:
            continue
        out[key.strip()] = parts[0] if parts else ""
    return out


def read_os_release(sr: Sysroot) -> dict[str, str]:
    """os-release fields from /etc/os-release or /usr/lib/os-release ({} if absent or garbled)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        text = sr.read_text(rel, what="expected KEY=value lines")
        if text is None:
            continue
        fields = parse_os_release(text)
        if not fields.get("PRETTY_NAME") and not fields.get("NAME"):
            sr.note(f"/{rel}: no NAME or PRETTY_NAME; os unknown")
            return {}
        return fields
    return {}


def os_name(fields: dict[str, str]) -> str | None:
    if fields.get("PRETTY_NAME"):
        return fields["PRETTY_NAME"]
    if fields.get("NAME"):
        return " ".join(x for x in (fields["NAME"], fields.get("VERSION", "")) if x)
    return None


def read_dmi(sr: Sysroot) -> tuple[str | None, str | None]:
    """(vendor, model) of an x86 machine from DMI, skipping BIOS placeholders."""

    def get(key: str) -> str | None:
        value = sr.read_text(f"sys/class/dmi/id/{key}", what="expected a DMI string")
        return value if value and value.lower() not in DMI_PLACEHOLDERS else None

    vendor = get("sys_vendor") or get("board_vendor")
    model = get("product_name") or get("board_name")
    if vendor and vendor.lower() == "lenovo":
        # Lenovo puts the machine-type code (21NSCTO1WW) in product_name and the name in product_version.
        model = get("product_version") or model
    return vendor, model
