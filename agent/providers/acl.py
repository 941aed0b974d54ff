"""The `acl` provider: the Arm Compute Library EP, only in custom (older) onnxruntime builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.providers._ortep import OrtEpProvider

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile


class AclProvider(OrtEpProvider):
    name = "acl"
    ep_name = "ACLExecutionProvider"
    label = "ACL"
    devices = ("CPU",)
    precision_default = "f32"

    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        if profile.arch != "aarch64":
            return (
                f"the Arm Compute Library EP needs an Arm CPU; this profile is {profile.arch or 'of unknown arch'}",
                "use cpu",
            )
        return None

    def runtime_devices(self, profile: "HardwareProfile") -> tuple[list[Any] | None, str | None]:
        devs, why = super().runtime_devices(profile)
        if why and "not in this onnxruntime build" in why:
            why = (
                "ACL EP not in this onnxruntime build: no pip wheel ships it (and the ArmNN EP was removed from "
                "onnxruntime)"
            )
        return devs, why

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return (
            "build onnxruntime from source with --use_acl, or use cpu: the aarch64 onnxruntime wheel already "
            "has KleidiAI kernels"
        )
