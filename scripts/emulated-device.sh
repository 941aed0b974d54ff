#!/usr/bin/env bash
# An emulated Raspberry Pi: a Debian bookworm arm64 rootfs under qemu-user, with the project installed by
# scripts/install.sh and a captured board's /proc and /sys files presented; runs a command inside it.
#   bash scripts/emulated-device.sh {pi4,pi5} [COMMAND...]      (no COMMAND: build/refresh and print the rootfs)
#   bash scripts/emulated-device.sh --check      (registers qemu-aarch64; exit 0 ready, 3 this host cannot, 1 setup missing)
# Run as root. The rootfs is cached under ${EDGE_AGENT_EMU_CACHE:-/var/cache/edge-agent-emu}, keyed by what goes in
# it (Debian suite and packages, the wheels' versions, this script's recipe); the project is re-installed when its
# source changes. Inside: QEMU_CPU=cortex-a72 (pi4) / cortex-a76 (pi5), EDGE_AGENT_EMULATED=qemu-user:<board>, the
# current directory and TMPDIR (else /tmp) at the same paths, the host's network (127.0.0.1 is the host's loopback).
# Mounts live in a private mount namespace (unshare -m): they vanish with its last process, whatever the exit.
set -euo pipefail
shopt -s inherit_errexit

SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$SRC_DIR/scripts/emulated-device.sh"
CACHE="${EDGE_AGENT_EMU_CACHE:-/var/cache/edge-agent-emu}"
MIRROR="${EDGE_AGENT_EMU_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# python3 only: the venv is made --without-pip and filled from the host (build_runtime). python3-venv pulls
# python3-pip-whl and with it ca-certificates, whose postinst (update-ca-certificates, run again as a trigger)
# spawns a few hundred processes under qemu: 312 s of the first run alone under load 15-20 (measured).
DEB_INCLUDE="python3"
RECIPE=3                 # bump when debootstrap's step below changes what ends up in the base rootfs
RUNTIME_RECIPE=2         # bump when the later steps change what ends up in the rootfs (keys the runtime and the rest)
PY_TAG=3.11              # bookworm's python3
PLATFORMS=(manylinux2014_aarch64 manylinux_2_17_aarch64 manylinux_2_28_aarch64 manylinux_2_31_aarch64
  manylinux_2_34_aarch64 manylinux_2_35_aarch64 manylinux_2_36_aarch64)
# Runtime wheels for the Pi (install.sh's cpu runtime) plus OpenVINO's Arm CPU plugin, and the editable build's
# backend, and both generative runtimes: onnxruntime-genai (its 0.18 has cp311 manylinux_2_28_aarch64 wheels) and
# OpenVINO GenAI with its tokenizers (2026.4.1: cp311 manylinux_2_31_aarch64): generative packages of either
# qualify on the emulated Pi. Versions follow the host's venv when it has them, so Arm and x86 runs compare the same releases.
# ml_dtypes is onnx's dependency, pinned as well: left to float, 0.7's module init took ~12 s under qemu-user
# (0.5: 0.4 s), paid by every process that imports onnx (each package check and qualification worker).
# pip is the venv's own (installed from the host like the rest, so install.sh's `pip install --upgrade pip` from
# the wheelhouse finds it current).
PKGS=(click pyyaml psutil numpy onnx ml_dtypes onnxruntime onnxruntime-genai paho-mqtt cryptography openvino openvino-genai openvino-tokenizers grpcio grpcio-health-checking protobuf pysimdjson setuptools wheel pip)

say() { echo "[emulated-device] $*" >&2; }
die() { echo "emulated-device.sh: error: $*" >&2; exit 1; }
cannot() { echo "emulated-device.sh: this host cannot run arm64 binaries: $*" >&2; exit 3; }  # exit 3: skip, not fail

usage() { sed -n '2,10p' "$SELF" | sed 's/^# \{0,1\}//'; }

board_files() {  # captured sysroot for a board
  case "$1" in
    pi4) echo "$SRC_DIR/agent/sysroots/rpi4-4gb" ;;
    pi5) echo "$SRC_DIR/agent/sysroots/rpi5-8gb" ;;
    *) return 1 ;;
  esac
}
board_cpu() { case "$1" in pi4) echo cortex-a72 ;; pi5) echo cortex-a76 ;; esac; }

# ------------------------------------------------------------------ host: can it run arm64 binaries?

binfmt_ready() {
  local f=/proc/sys/fs/binfmt_misc/qemu-aarch64
  [ -r "$f" ] && head -1 "$f" | grep -q enabled
}

ensure_binfmt() {  # register qemu-aarch64 (F flag: the interpreter is loaded now, no copy in the rootfs needed)
  command -v qemu-aarch64-static >/dev/null 2>&1 || die "qemu-user-static is not installed (apt-get install qemu-user-static binfmt-support debootstrap)"
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
      cannot "binfmt_misc is not mounted and cannot be (a container without CAP_SYS_ADMIN, or a kernel without it)"
  fi
  if ! binfmt_ready; then
    if command -v update-binfmts >/dev/null 2>&1; then update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true; fi
  fi
  binfmt_ready || die "qemu-aarch64 is not registered in binfmt_misc (update-binfmts --enable qemu-aarch64 failed)"
}

# ------------------------------------------------------------------ cache keys

sha() { sha256sum | cut -c1-16; }

host_py() {  # the host venv's Python (its versions pin the wheels), else python3
  local py="${EDGE_AGENT_VENV:-$SRC_DIR/.venv}/bin/python"
  if [ -x "$py" ]; then echo "$py"; else echo python3; fi
}
host_py_tag() { "$(host_py)" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }

wheel_reqs() {  # one requirement per line, pinned to the host venv's versions where it has the package
  # One interpreter start for all of them: this runs on every call of this script (it keys the cache).
  local py="${EDGE_AGENT_VENV:-$SRC_DIR/.venv}/bin/python" out
  if [ -x "$py" ] && out="$("$py" -c 'import sys, importlib.metadata as m
for p in sys.argv[1:]:
    v = ""
    if p not in ("setuptools", "wheel"):  # build backend: any recent one
        try: v = m.version(p)
        except Exception: pass
    print(f"{p}=={v}" if v else p)' "${PKGS[@]}" 2>/dev/null)"; then
    echo "$out"
  else
    printf '%s\n' "${PKGS[@]}"
  fi
}

base_key() { printf 'recipe=%s suite=%s arch=arm64 variant=minbase include=%s\n' "$RECIPE" "$SUITE" "$DEB_INCLUDE" | sha; }

# ------------------------------------------------------------------ build stages (each: build in NAME.partial, then rename)

with_lock() {  # [NAME]: serialise builds between concurrent callers (pytest-xdist workers, CI jobs)
  mkdir -p "$CACHE"
  exec 9>"$CACHE/${1:-.lock}"  # fd 9 again: taking another lock releases the one held
  flock 9
}

build_base() {  # debootstrap: Debian bookworm arm64 minbase with python3 and venv
  local dir="$CACHE/base-$(base_key)" t0
  [ -d "$dir" ] && { echo "$dir"; return; }
  rm -rf "$dir.partial"
  t0=$(date +%s)
  say "building the arm64 rootfs (debootstrap $SUITE from $MIRROR; ~15 min on a busy machine): $dir"
  if ! nice -n 10 debootstrap --arch=arm64 --variant=minbase --include="$DEB_INCLUDE" "$SUITE" "$dir.partial" "$MIRROR" 2>&1 |
    while IFS= read -r line; do case "$line" in I:\ Retrieving* | I:\ Validating*) ;; *) echo "[emulated-device] debootstrap: $line" >&2 ;; esac; done; then
    die "debootstrap failed (see above); partial tree left in $dir.partial"
  fi
  rm -rf "$dir.partial/var/cache/apt/archives/"*.deb
  mv "$dir.partial" "$dir"
  say "rootfs built in $(($(date +%s) - t0)) s"
  echo "$dir"
}


build_wheels() {  # aarch64 cp311 wheels fetched on the host (pip inside the emulated rootfs is slow and crashed once)
  local reqs key dir py t0
  reqs="$(wheel_reqs)"
  key="$(printf '%s\n' "${PLATFORMS[@]}" "$reqs" | sha)"
  dir="$CACHE/wheels-$key"
  [ -d "$dir" ] && { echo "$dir"; return; }
  py="$(host_py)"
  rm -rf "$dir.partial"; mkdir -p "$dir.partial"
  t0=$(date +%s)
  say "downloading aarch64 wheels for Python $PY_TAG: $(echo "$reqs" | tr '\n' ' ')"
  printf '%s\n' "$reqs" > "$dir.partial/requirements.txt"
  local plat=() p
  for p in "${PLATFORMS[@]}"; do plat+=(--platform "$p"); done
  PIP_FIND_LINKS="" nice -n 10 "$py" -m pip download -q --disable-pip-version-check -d "$dir.partial" \
    --only-binary=:all: --python-version "$PY_TAG" --implementation cp "${plat[@]}" --platform any \
    -r "$dir.partial/requirements.txt" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' >&2 || true; } ||
    die "pip download of the aarch64 wheels failed (network? see above)"
  mv "$dir.partial" "$dir"
  say "wheels fetched in $(($(date +%s) - t0)) s"
  echo "$dir"
}

in_root() {  # ROOT CMD...: run a build step inside the rootfs (a private mount namespace; no board files)
  local root="$1"; shift
  unshare -m --propagation private bash -c '
    set -e; root="$1"; shift
    mount -t proc proc "$root/proc"; mount -t sysfs -o ro sysfs "$root/sys"; mount --rbind /dev "$root/dev"
    exec nice -n "${NICE:-0}" chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 QEMU_CPU=cortex-a72 "$@"' _ "$root" "$@"
}

host_compile() {  # ROOT DIR: byte-compile DIR (inside ROOT) with the host's Python when it is the rootfs's minor version
  # A .pyc depends on the Python version, not on the CPU: compiled here in seconds instead of under emulation,
  # with the paths the rootfs sees (-s/-p). Files that do not compile (templates, other Pythons) are skipped,
  # as pip skips them. Another Python on the host: left to the first import inside (correct, slower).
  local py; py="$(host_py)"
  [ "$(host_py_tag)" = "$PY_TAG" ] || return 0
  nice -n 10 "$py" -m compileall -qq -j 0 -s "$1" -p / "$1$2" >/dev/null 2>&1 || true
}

build_runtime() {  # BASE WHEELS: the base plus /opt/edge-agent/venv holding the runtime wheels (not the project)
  local base="$1" wh="$2" key dir t0 sp plat=() p
  key="$(printf '%s\n' "recipe=$RUNTIME_RECIPE" "$(basename "$base")" "$(cd "$wh" && ls | sort)" "host-compiled=$(host_py_tag)" | sha)"
  dir="$CACHE/runtime-$key"
  [ -d "$dir" ] && { echo "$dir"; return; }
  rm -rf "$dir.partial"
  t0=$(date +%s)
  say "copying the base rootfs and installing $(ls "$wh" | grep -c '\.whl$') wheels into /opt/edge-agent/venv (host pip)"
  cp -a "$base" "$dir.partial"
  # TLS inside needs the host's CA bundle (PIP_CERT and friends point at this path); loopback names resolve.
  [ -r /etc/ssl/certs/ca-certificates.crt ] && mkdir -p "$dir.partial/etc/ssl/certs" &&
    cp /etc/ssl/certs/ca-certificates.crt "$dir.partial/etc/ssl/certs/ca-certificates.crt"
  [ -r /etc/resolv.conf ] && cp -L /etc/resolv.conf "$dir.partial/etc/resolv.conf" || true
  grep -q '^127.0.0.1' "$dir.partial/etc/hosts" 2>/dev/null || printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >> "$dir.partial/etc/hosts"
  # The venv is made by the rootfs's own python3 (emulated: one interpreter start); the wheels are unpacked into
  # it by the host's pip for the rootfs's platform and Python. Emulated pip took 47 s quiet (byte-compiling
  # every module under qemu) and qemu-user crashed it now and then.
  NICE=10 in_root "$dir.partial" python3 -m venv --without-pip /opt/edge-agent/venv
  sp="/opt/edge-agent/venv/lib/python$PY_TAG/site-packages"
  [ -d "$dir.partial$sp" ] || die "the rootfs's venv has no $sp (its python3 is not $PY_TAG?)"
  for p in "${PLATFORMS[@]}"; do plat+=(--platform "$p"); done
  PIP_FIND_LINKS="" nice -n 10 "$(host_py)" -m pip install -q --disable-pip-version-check --no-index --find-links "$wh" \
    --only-binary=:all: --python-version "$PY_TAG" --implementation cp "${plat[@]}" --platform any \
    --target "$dir.partial$sp" --no-compile --no-warn-conflicts -r "$wh/requirements.txt" >&2 ||
    die "installing the aarch64 wheels into $dir.partial$sp failed (see above)"
  rm -rf "$dir.partial$sp/bin"  # console scripts written for the host's python (the venv runs `python -m pip`)
  host_compile "$dir.partial" "$sp"
  mv "$dir.partial" "$dir"
  say "runtime venv built in $(($(date +%s) - t0)) s"
  echo "$dir"
}

src_hash() {  # what install.sh copies into /opt/edge-agent/src
  (cd "$SRC_DIR" && find agent targets hwtests pyproject.toml README.md scripts systemd docs -type f \
    ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 2>/dev/null | sort -z | xargs -0 sha256sum) | sha
}

install_sh() {  # BOARD ROOT WHAT ARGS...: scripts/install.sh inside ROOT with BOARD's files, retried (qemu-user crashes)
  local board="$1" root="$2" what="$3" n=0; shift 3
  until WH="$WHEELS" SRC="$SRC_DIR" NICE=10 run_board "$board" "$root" /mnt/edge-agent-src -- \
      bash /mnt/edge-agent-src/scripts/install.sh --no-systemd "$@" >&2; do
    n=$((n + 1)); [ $n -lt 3 ] || die "install.sh inside the $what rootfs failed 3 times"
    say "install.sh failed inside the emulated $what rootfs; retrying ($n/2)"
  done
}

build_project() {  # RUNTIME: the runtime plus the project, installed once by install.sh (venv, editable install)
  local runtime="$1" dir stamp want t0
  dir="$CACHE/project-${runtime##*/runtime-}"
  stamp="$dir.installed"
  want="$(src_hash)"
  if [ -d "$dir" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then echo "$dir"; return; fi
  if [ ! -d "$dir" ]; then
    rm -rf "$dir.partial"; cp -a "$runtime" "$dir.partial"; mv "$dir.partial" "$dir"
  fi
  rm -f "$stamp"
  t0=$(date +%s)
  # The venv half of install.sh (pip's editable install, emulated: the slow part) does not depend on the board
  # (both Pis get the cpu runtime), so it runs once, here, on the Pi 4's files; each board's copy then has
  # install.sh write its own configuration, unit drop-in and device id (build_board).
  say "installing the project with scripts/install.sh --no-systemd (source $want)"
  install_sh pi4 "$dir" project --wheelhouse /wheelhouse
  echo "$want" > "$stamp"
  say "project installed in $(($(date +%s) - t0)) s"
  echo "$dir"
}

build_board() {  # BOARD PROJECT: a copy of the project stage where install.sh --no-venv writes this board's files
  local board="$1" project="$2" dir stamp want t0
  dir="$CACHE/$board-${project##*/project-}"
  stamp="$dir.installed"
  want="$(cat "$project.installed")"
  if [ -d "$dir" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then echo "$dir"; return; fi
  t0=$(date +%s)
  rm -rf "$dir" "$dir.partial" "$stamp"
  cp -a "$project" "$dir.partial"
  # install.sh never overwrites a configuration: the project stage's (the Pi 4's device id) goes first.
  rm -f "$dir.partial/etc/edge-agent/agent.yaml"
  install_sh "$board" "$dir.partial" "$board" --no-venv
  host_compile "$dir.partial" /opt/edge-agent/src/agent  # install.sh's own compile is in its venv step
  mv "$dir.partial" "$dir"
  echo "$want" > "$stamp"
  say "$board: its copy installed by install.sh --no-venv in $(($(date +%s) - t0)) s"
  echo "$dir"
}

# ------------------------------------------------------------------ run a command on the emulated board

run_board() {  # BOARD ROOT WORKDIR -- CMD...: a private mount namespace with the board's files, then chroot
  local board="$1" root="$2" workdir="$3"; shift 4
  local files cpu
  files="$(board_files "$board")"; cpu="$(board_cpu "$board")"
  local tmp="${TMPDIR:-/tmp}"
  local pass=() v
  while IFS= read -r v; do
    case "$v" in EDGE_AGENT_VENV=* | EDGE_AGENT_EMU_*) ;; EDGE_AGENT_*=*) pass+=("$v") ;; esac
  done < <(env)
  ${RUN_EXEC:-} unshare -m --propagation private bash -c '
    set -e
    root="$1" files="$2" board="$3" cpu="$4" workdir="$5" tmp="$6"; shift 6
    npass="$1"; shift; pass=("${@:1:$npass}"); shift "$npass"
    mount -t proc proc "$root/proc"
    mount -t sysfs -o ro sysfs "$root/sys"        # OpenVINO (hwloc) aborts without /sys
    mount --rbind /dev "$root/dev"
    ro() { mount --bind "$1" "$2"; mount -o remount,bind,ro "$2"; }
    # The board: cpuinfo (onnxruntime segfaults under qemu-user on the host x86 one), meminfo, device tree,
    # firmware throttling flags, thermal zones, kernel release.
    ro "$files/proc/cpuinfo" "$root/proc/cpuinfo"
    ro "$files/proc/meminfo" "$root/proc/meminfo"
    [ -r "$files/proc/sys/kernel/osrelease" ] && ro "$files/proc/sys/kernel/osrelease" "$root/proc/sys/kernel/osrelease"
    mount -t tmpfs -o mode=0755,size=1m emu-firmware "$root/sys/firmware"
    mkdir -p "$root/sys/firmware/devicetree"; cp -a "$files/proc/device-tree" "$root/sys/firmware/devicetree/base"
    mount -t tmpfs -o mode=0755,size=1m emu-platform "$root/sys/devices/platform"
    cp -a "$files/sys/devices/platform/." "$root/sys/devices/platform/"
    mount -t tmpfs -o mode=0755,size=1m emu-thermal "$root/sys/class/thermal"
    cp -a "$files/sys/class/thermal/." "$root/sys/class/thermal/"
    mount -o remount,ro "$root/sys/firmware"; mount -o remount,ro "$root/sys/devices/platform"
    mount -o remount,ro "$root/sys/class/thermal"
    [ -z "${WH:-}" ] || { mkdir -p "$root/wheelhouse"; mount --bind "$WH" "$root/wheelhouse"; }
    [ -z "${SRC:-}" ] || { mkdir -p "$root/mnt/edge-agent-src"; ro "$SRC" "$root/mnt/edge-agent-src"; }
    # The current directory and TMPDIR at the same paths (never over the rootfs own system directories).
    share() {
      case "$1" in /|/bin|/sbin|/lib|/lib64|/usr|/usr/*|/etc|/etc/*|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/opt/edge-agent|/opt/edge-agent/*|/var/lib/edge-agent*|/mnt/edge-agent-src*) return 0 ;; esac
      [ -d "$1" ] || return 0
      mkdir -p "$root$1"
      [ "$(realpath -m "$root$1")" = "$root$1" ] || { echo "[emulated-device] not sharing $1: a symlink in the rootfs" >&2; return 0; }
      mountpoint -q "$root$1" || mount --rbind "$1" "$root$1"
    }
    share "$tmp"
    [ "$workdir" = /mnt/edge-agent-src ] || share "$workdir"
    exec nice -n "${NICE:-0}" chroot "$root" /usr/bin/env -i \
      PATH=/opt/edge-agent/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" TMPDIR="$tmp" QEMU_CPU="$cpu" \
      EDGE_AGENT_EMULATED="qemu-user:$board" PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "${pass[@]}" \
      /bin/sh -c '"'"'cd "$0" 2>/dev/null || cd /; exec "$@"'"'"' "$workdir" "$@"
  ' _ "$root" "$files" "$board" "$cpu" "$workdir" "$tmp" "${#pass[@]}" "${pass[@]}" "$@"
}

# ------------------------------------------------------------------ main

case "${1:-}" in
  -h | --help | "") usage; [ -n "${1:-}" ] || exit 2; exit 0 ;;
  --check)
    [ "$(id -u)" -eq 0 ] || cannot "not root (chroot, mount namespaces and binfmt_misc registration need it)"
    unshare -m true 2>/dev/null || cannot "unshare -m is refused (no mount namespaces here)"
    ensure_binfmt; command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed"
    echo "ok: qemu-aarch64 registered ($(head -1 /proc/sys/fs/binfmt_misc/qemu-aarch64)), debootstrap present"
    exit 0 ;;
esac
BOARD="$1"; shift
board_files "$BOARD" >/dev/null || die "unknown board '$BOARD': expected pi4 or pi5"
[ -d "$(board_files "$BOARD")/proc" ] || die "captured board files missing: $(board_files "$BOARD")"
[ "$(id -u)" -eq 0 ] || cannot "not root (chroot, mount namespaces and binfmt_misc registration need it)"
[ "$(uname -m)" = x86_64 ] || [ "$(uname -m)" = aarch64 ] || die "unsupported host $(uname -m)"
if [ "$(uname -m)" != aarch64 ]; then ensure_binfmt; fi
command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed (apt-get install debootstrap)"

ROOT="$(
  with_lock
  # The wheels are fetched on the host while debootstrap runs (both mostly wait on the network).
  wheels_path="$CACHE/.wheels-path.$$"
  build_wheels > "$wheels_path" &
  wheels_pid=$!
  base="$(build_base)"
  wait "$wheels_pid" || die "fetching the aarch64 wheels failed (see above)"
  WHEELS="$(cat "$wheels_path")"; rm -f "$wheels_path"
  runtime="$(build_runtime "$base" "$WHEELS")"
  project="$(build_project "$runtime")"
  with_lock ".$BOARD.lock"  # the shared stages are done: one board's copy is made while the other's is
  build_board "$BOARD" "$project"
)"
if [ $# -eq 0 ]; then echo "$ROOT"; exit 0; fi
RUN_EXEC=exec run_board "$BOARD" "$ROOT" "$PWD" -- "$@"
