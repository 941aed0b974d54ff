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
    assert mode == "stop-then-start" and "1000 MiB < 2 x the model's size 600 MiB" in why
    mode, why = choose_swap(serving, 300 * MIB, 1000 * MIB)
    assert mode == "make-before-break" and ">=" in why
    assert choose_swap(serving, 600 * MIB, None)[0] == "make-before-break"


def test_targets_without_a_fallback_keep_their_mode():
    assert choose_swap({"swap": "stop-then-start"}, 10 * MIB, 1 * MIB)[0] == "stop-then-start"
    assert choose_swap({}, 10 * MIB, 1 * MIB)[0] == "make-before-break"


def test_trim_heap_is_safe_to_call():
    assert trim_heap() in (True, False)


def test_memory_default_is_what_the_device_can_give(tmp_path):
    """Issue 28, 8: without a configured or target limit, 80% of MemAvailable, or of the room left under the
    process's cgroup memory.max where that is lower; the reason names the source."""
    from agent.serving.memory import cgroup_room, device_memory, resolve_memory_max

    root = tmp_path
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal:       24000000 kB\nMemAvailable:   10000000 kB\n")
    (root / "proc" / "self" / "cgroup").write_text("0::/system.slice/edge-agent.service\n")
    cap, why = resolve_memory_max(None, {}, root=str(root))
    assert cap == int(10000000 * 1024 * 0.8) and "MemAvailable" in why, why  # not 80% of MemTotal
    cg = root / "sys" / "fs" / "cgroup" / "system.slice" / "edge-agent.service"
    cg.mkdir(parents=True)
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("1000\n")
    assert cgroup_room(str(root)) is None  # no limit set
    (cg / "memory.max").write_text(f"{2 << 30}\n")
    (cg / "memory.current").write_text(f"{512 << 20}\n")
    assert cgroup_room(str(root)) == (2 << 30) - (512 << 20)
    room, source = device_memory(str(root))
    assert room == (2 << 30) - (512 << 20) and source.startswith("cgroup memory.max room")
    cap, why = resolve_memory_max(None, {}, root=str(root))
    assert cap == int(room * 0.8) and "cgroup" in why


def test_cgroup_v1_limit_counts_too(tmp_path):
    """A cgroup v1 host (Docker there, JetPack 5): memory.limit_in_bytes - memory.usage_in_bytes, under the
    process's path or, in a container that sees only its own cgroup, at the hierarchy's root; "no limit" is the
    largest page-aligned number."""
    from agent.serving.memory import cgroup_room

    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("4:memory:/docker/abc\n1:cpu:/\n0::/\n")
    v1 = tmp_path / "sys" / "fs" / "cgroup" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory.usage_in_bytes").write_text("1000\n")
    assert cgroup_room(str(tmp_path)) is None  # unlimited
    (v1 / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{256 << 20}\n")
    assert cgroup_room(str(tmp_path)) == (1 << 30) - (256 << 20)  # the container's view: the root of memory/
    own = v1 / "docker" / "abc"
    own.mkdir(parents=True)
    (own / "memory.limit_in_bytes").write_text(f"{512 << 20}\n")
    (own / "memory.usage_in_bytes").write_text(f"{100 << 20}\n")
    assert cgroup_room(str(tmp_path)) == (512 << 20) - (100 << 20)  # the host's view: the process's own path


def test_swap_mode_says_what_the_need_is():
    mode, why = choose_swap({"swap_when_memory_short": "stop-then-start"}, 700 * MIB, 1000 * MIB, "measured peak")
    assert mode == "stop-then-start" and "2 x the model's measured peak 700 MiB" in why
