"""Qualification test helpers: the hardware profile the harness tests qualify on."""

from __future__ import annotations

from agent.hardware.profile import CpuInfo, HardwareProfile

# An x86_64 CPU class with avx512_bf16, where OpenVINO defaults to bf16 and f32 is offered (the profile only
# decides which rows are planned: every row runs on this host's real runtimes).
BF16_X86 = HardwareProfile(
    arch="x86_64",
    os="Linux",
    cpu=CpuInfo(vendor="AuthenticAMD", model="test", cores=2, flags=("avx2", "avx512f", "avx512_bf16")),
)
