"""PCI/USB/DRM/accel accelerators: Intel iGPU and NPU, AMD/NVIDIA GPUs, Hailo, Coral."""

from __future__ import annotations

from agent.hardware.profile import Accelerator
from agent.hardware.sysroot import Sysroot

GPU_VENDORS = {"0x8086": "intel", "0x1002": "amd", "0x10de": "nvidia"}
GPU_NAMES = {
    "0x7d55": "Intel Arc Graphics (Meteor Lake)",
    "0x7dd5": "Intel Graphics (Meteor Lake)",
    "0x7d45": "Intel Graphics (Meteor Lake)",
    "0x7d51": "Intel Arc Graphics (Arrow Lake)",
    "0x64a0": "Intel Arc 140V (Lunar Lake)",
    "0xa7a0": "Intel Iris Xe (Raptor Lake)",
    "0x46a6": "Intel Iris Xe (Alder Lake)",
    "0x46d1": "Intel UHD Graphics (Alder Lake-N)",
    "0x9a49": "Intel Iris Xe (Tiger Lake)",
    "0x3e92": "Intel UHD Graphics 630",
    "0x3e91": "Intel UHD Graphics 630",
    "0x5917": "Intel UHD Graphics 620",
    "0x56a0": "Intel Arc A770",
    "0x56a1": "Intel Arc A750",
    "0xe20b": "Intel Arc B580",
}
INTEL_NPUS = {"0x7d1d": "Meteor Lake", "0xad1d": "Arrow Lake", "0x643e": "Lunar Lake", "0xb03e": "Panther Lake"}
PCI_ACCELERATORS = {
    ("0x1e60", "0x2864"): ("npu", "hailo", "Hailo-8/8L", "/dev/hailo0"),
    ("0x1e60", "0x45c4"): ("npu", "hailo", "Hailo-10H", "/dev/hailo0"),
    ("0x1ac1", "0x089a"): ("tpu", "google", "Coral Edge TPU (PCIe)", "/dev/apex_0"),
}
USB_ACCELERATORS = {
    ("1a6e", "089a"): ("tpu", "google", "Coral Edge TPU (USB, firmware not loaded)"),
    ("18d1", "9302"): ("tpu", "google", "Coral Edge TPU (USB)"),
}


def _hex_id(sr: Sysroot, rel: str) -> str | None:
    def parse(text: str) -> str:
        int(text, 16)  # ValueError: not a hex id
        return text.lower() if text.lower().startswith("0x") else "0x" + text.lower()

    return sr.read_value(rel, parse, "expected a hex id like 0x8086")


def drm_gpus(sr: Sysroot) -> list[Accelerator]:
    """GPUs with a render node: /sys/class/drm/renderD*/device/{vendor,device}."""
    out = []
    for entry in sr.glob("sys/class/drm/renderD*"):
        vendor = _hex_id(sr, f"{entry}/device/vendor")
        vendor_name = GPU_VENDORS.get(vendor or "")
        if vendor_name is None:
            continue
        device = _hex_id(sr, f"{entry}/device/device")
        label = {"intel": "Intel GPU", "amd": "AMD GPU", "nvidia": "NVIDIA GPU"}[vendor_name]
        name = GPU_NAMES.get(device or "") if vendor_name == "intel" else None
        name = name or (f"{label} ({device})" if device else label)
        out.append(Accelerator(kind="gpu", vendor=vendor_name, name=name, device="/dev/dri/" + entry.rsplit("/", 1)[1]))
    return out


def accel_npus(sr: Sysroot) -> list[Accelerator]:
    """NPUs of the Linux accel subsystem: /sys/class/accel/accel*/device/{vendor,device}, /dev/accel/*."""
    out = []
    entries = sr.glob("sys/class/accel/accel*")
    for entry in entries:
        node = entry.rsplit("/", 1)[1]
        vendor, device = _hex_id(sr, f"{entry}/device/vendor"), _hex_id(sr, f"{entry}/device/device")
        if vendor == "0x8086":
            gen = INTEL_NPUS.get(device or "")
            name = f"Intel NPU ({gen})" if gen else f"Intel NPU ({device or 'unknown device'})"
            out.append(Accelerator(kind="npu", vendor="intel", name=name, device=f"/dev/accel/{node}"))
            if not sr.exists(f"dev/accel/{node}"):
                sr.note(f"{name}: no /dev/accel/{node} node (container without the device, or missing udev rules)")
        elif vendor is not None:
            out.append(
                Accelerator(
                    kind="npu", vendor=f"pci-{vendor}", name=f"NPU {vendor}:{device}", device=f"/dev/accel/{node}"
                )
            )
    if not entries:
        for node in sr.glob("dev/accel/accel*"):
            sr.note(f"/{node} exists but /sys/class/accel has no entry for it; vendor unknown")
    return out


def pci_accelerators(sr: Sysroot) -> list[Accelerator]:
    """Hailo and Coral by PCI id (/sys/bus/pci/devices/*) or by their device nodes."""
    found: dict[str, Accelerator] = {}
    for entry in sr.glob("sys/bus/pci/devices/*"):
        key = (_hex_id(sr, f"{entry}/vendor"), _hex_id(sr, f"{entry}/device"))
        if key in PCI_ACCELERATORS:
            kind, vendor, name, node = PCI_ACCELERATORS[key]
            dev = node if sr.exists(node.lstrip("/")) else f"pci:{entry.rsplit('/', 1)[1]}"
            if not dev.startswith("/"):
                sr.note(f"{name} found on PCI ({dev}) but {node} is missing: its kernel driver is not loaded")
            found.setdefault(node, Accelerator(kind=kind, vendor=vendor, name=name, device=dev))
    if "/dev/hailo0" not in found and sr.exists("dev/hailo0"):
        found["/dev/hailo0"] = Accelerator(kind="npu", vendor="hailo", name="Hailo", device="/dev/hailo0")
    for node in sr.glob("dev/apex_*"):
        found.setdefault(
            "/" + node, Accelerator(kind="tpu", vendor="google", name="Coral Edge TPU (PCIe)", device="/" + node)
        )
    for entry in sr.glob("sys/bus/usb/devices/*"):
        vid = sr.read_text(f"{entry}/idVendor") if sr.exists(f"{entry}/idVendor") else None
        pid = sr.read_text(f"{entry}/idProduct") if vid else None
        if vid is not None and pid is not None and (vid, pid) in USB_ACCELERATORS:
            kind, vendor, name = USB_ACCELERATORS[(vid, pid)]
            found.setdefault(
                "usb:" + entry, Accelerator(kind=kind, vendor=vendor, name=name, device=f"usb:{vid}:{pid}")
            )
    return list(found.values())
