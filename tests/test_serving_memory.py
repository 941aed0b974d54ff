"""The memory-aware swap choice (targets' swap_when_memory_short) and MemAvailable from captured sysroots."""

from __future__ import annotations

from agent import sysroots as captures
from agent.serving.memory import choose_swap, mem_available, trim_heap
from agent.targets import get_target

SYSROOTS = captures.root()  # the device captures: package data (agent/sysroots)
MIB = 1 << 20


def test_mem_available_reads_meminfo_under_a_root(tmp_path):
    assert mem_available(str(SYSROOTS / "rpi4-4gb")) is not None
    assert mem_available(str(tmp_path)) is None
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: garbage kB\n")
    assert mem_available(str(tmp_path)) is None
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable:     512 kB\n")
    assert mem_available(str(tmp_path)) == 512 * 1024


def test_short_memory_switches_a_pi_to_stop_then_start():
    serving = get_target("raspberry-pi-4").serving
    mode, why = choose_swap(serving, 600 * MIB, 1000 * MIB)
    assert mode == "stop-then-start" and "1000 MiB < 2 x the model's 600 MiB" in why
    mode, why = choose_swap(serving, 300 * MIB, 1000 * MIB)
    assert mode == "make-before-break" and ">=" in why
    assert choose_swap(serving, 600 * MIB, None)[0] == "make-before-break"


def test_targets_without_a_fallback_keep_their_mode():
    assert choose_swap({"swap": "stop-then-start"}, 10 * MIB, 1 * MIB)[0] == "stop-then-start"
    assert choose_swap({}, 10 * MIB, 1 * MIB)[0] == "make-before-break"


def test_trim_heap_is_safe_to_call():
    assert trim_heap() in (True, False)
