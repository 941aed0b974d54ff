#!/usr/bin/env bash
# Install edge-agent as a systemd service on Raspberry Pi OS (bookworm), Ubuntu 22.04/24.04 or JetPack 6.
# Idempotent: run it again to upgrade; existing configuration is never overwritten. `--help` lists the flags.
set -euo pipefail

SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=edge-agent
JETSON_INDEX="https://pypi.jetson-ai-lab.io/jp6/cu126"   # JetPack 6: CUDA 12.6, cp310 wheels

ROOT="" VENV_MODE="" VENV_DIR="/opt/edge-agent/venv" RUNTIME=auto WHEELHOUSE="" TARGET="" DEVICE_ID="" RELEASE="" TRUST=""
ENABLE=1 START=1 DRY=0 UNINSTALL=0 PURGE=0 NO_SYSTEMD=0

usage() {
  cat <<EOF
Usage: bash scripts/install.sh [options]

Installs: system user '$NAME', source in /opt/edge-agent/src, virtualenv in /opt/edge-agent/venv with the
runtime for this device, /etc/edge-agent/agent.yaml (only if absent; stable device id), state and cache dirs,
/etc/systemd/system/$NAME.service + a device drop-in (MemoryMax from the target, accelerator groups),
then enables and (re)starts the service. Run as root.

Options:
  --root DIR          install into DIR instead of / (packaging, images, tests): no useradd, no chown,
                      no systemctl, no pip unless --venv; device facts are read under DIR
  --venv | --no-venv  create/update the virtualenv (default: --venv, except with --root)
  --venv-dir DIR      virtualenv location (default $VENV_DIR); with --no-venv, an existing one to use
  --runtime NAME      auto (default) | cpu | openvino | jetson | qnn
                        cpu: onnxruntime; openvino: + openvino and the OpenVINO EP (Intel x86_64);
                        jetson: onnxruntime-gpu from $JETSON_INDEX; qnn: + onnxruntime-qnn (Qualcomm aarch64)
  --wheelhouse DIR    offline install: pip --no-index --find-links DIR (must hold every wheel needed)
  --release DIR       install a signed release (edge-agent release build) side by side instead of --venv:
                      /opt/edge-agent/releases/VERSION/venv, offline, every wheel's sha256 required; the
                      'current' link names it and the unit runs /opt/edge-agent/current/venv; the guard
                      (edge-agent-guard) goes to /opt/edge-agent/guard/bin, its unit
                      edge-agent-guard.service beside the agent's (docs/self-update.md). A release
                      built with --no-deps uses the packages of --venv-dir (under --root: the one in DIR,
                      else the one on this host)
  --trust FILE        with --release: the fleet public key its release.json must be signed with
  --target NAME       target profile for MemoryMax (default: detected; see targets/)
  --device-id ID      device_id for a new config (default: board serial, else /etc/machine-id)
  --no-enable         install the unit without enabling it
  --no-start          do not (re)start the service
  --no-systemd        a rootfs or container without a running systemd (image builds, chroots, emulated
                      devices): everything above, the unit enabled by symlink, never systemctl; start the
                      agent yourself ($VENV_DIR/bin/edge-agent run --config /etc/edge-agent/agent.yaml)
  --dry-run           print what would be done; change nothing
  --uninstall         stop and remove the service, venv and source (keeps config and state)
  --purge             with --uninstall: also remove config, state, cache and the user
  -h, --help          this text
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT="${2:?--root needs a directory}"; shift ;;
    --root=*) ROOT="${1#*=}" ;;
    --venv) VENV_MODE=1 ;;
    --no-venv) VENV_MODE=0 ;;
    --venv-dir) VENV_DIR="${2:?--venv-dir needs a directory}"; shift ;;
    --runtime) RUNTIME="${2:?--runtime needs a name}"; shift ;;
    --wheelhouse) WHEELHOUSE="${2:?--wheelhouse needs a directory}"; shift ;;
    --target) TARGET="${2:?--target needs a name}"; shift ;;
    --release) RELEASE="${2:?--release needs a directory}"; shift ;;
    --trust) TRUST="${2:?--trust needs a public key file}"; shift ;;
    --device-id) DEVICE_ID="${2:?--device-id needs a value}"; shift ;;
    --no-enable) ENABLE=0 ;;
    --no-start) START=0 ;;
    --no-systemd) NO_SYSTEMD=1 ;;
    --dry-run) DRY=1 ;;
    --uninstall) UNINSTALL=1 ;;
    --purge) PURGE=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { if [ "$DRY" = 1 ]; then echo "[install] (dry-run) $*"; else echo "[install] $*"; fi; }
die() { echo "install.sh: error: $*" >&2; exit 1; }
run() { if [ "$DRY" = 1 ]; then echo "[install] would run: $*"; else "$@"; fi; }
has_systemctl() { [ "$NO_SYSTEMD" = 0 ] && command -v systemctl >/dev/null 2>&1; }

if [ -n "$ROOT" ]; then
  [ "$DRY" = 1 ] || mkdir -p "$ROOT" 2>/dev/null || die "cannot create --root $ROOT"
  R="$(cd "$ROOT" 2>/dev/null && pwd || echo "$ROOT")"
  SYSTEM=0
else
  R="" SYSTEM=1
  [ "$(id -u)" -eq 0 ] || [ "$DRY" = 1 ] || die "run as root (sudo bash scripts/install.sh), or use --root DIR or --dry-run"
fi
[ -n "$VENV_MODE" ] || VENV_MODE=$SYSTEM
[ -z "$DEVICE_ID" ] || [[ "$DEVICE_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]] || die "--device-id '$DEVICE_ID': expected 1-64 characters of [A-Za-z0-9._-]"
case "$RUNTIME" in auto|cpu|openvino|jetson|qnn) ;; *) die "--runtime '$RUNTIME': expected auto, cpu, openvino, jetson or qnn" ;; esac

UNIT_DIR="$R/etc/systemd/system"
UNIT="$UNIT_DIR/$NAME.service"
DROPIN="$UNIT_DIR/$NAME.service.d/10-device.conf"
WANTS="$UNIT_DIR/multi-user.target.wants/$NAME.service"
GUARD_UNIT="$UNIT_DIR/$NAME-guard.service"
GUARD_WANTS="$UNIT_DIR/multi-user.target.wants/$NAME-guard.service"
OPT="$R/opt/edge-agent"
CONF_DIR="$R/etc/edge-agent"
CONF="$CONF_DIR/agent.yaml"
STATE="$R/var/lib/edge-agent"
CACHE="$R/var/cache/edge-agent"

# ------------------------------------------------------------------ device facts (same files as agent.hardware)

readf() { [ -r "$R$1" ] && tr -d '\0' < "$R$1" 2>/dev/null || true; }
readdt() {  # a device-tree property: /proc/device-tree is a link to /sys/firmware/devicetree/base, either may be missing
  if [ -r "$R/proc/device-tree/$1" ]; then readf "/proc/device-tree/$1"; else readf "/sys/firmware/devicetree/base/$1"; fi
}

device_id() {  # mirrors agent.config.default_device_id
  local s
  s="$(readdt serial-number | tr -d '[:space:]')"
  if [ -n "$s" ]; then clean_id "$s"; return; fi
  s="$(readf /proc/cpuinfo | awk -F: '$1 ~ /^Serial[ \t]*$/ {gsub(/[ \t]/, "", $2); print $2; exit}')"
  if [ -n "$s" ] && [ -n "${s//0/}" ]; then clean_id "$s"; return; fi
  s="$(readf /etc/machine-id | tr -d '[:space:]')"
  if [[ "$s" =~ ^[0-9a-fA-F]{32}$ ]] && [ -n "${s//0/}" ]; then echo "edge-$(echo "${s:0:12}" | tr 'A-F' 'a-f')"; fi
}
clean_id() {  # alphanumerics, lower case, the last 16 (as Python's [-16:])
  local c; c="$(echo "$1" | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z')"
  [ ${#c} -le 16 ] || c="${c: -16}"
  echo "edge-$c"
}

detect_target() {  # a shell rendition of agent.targets.match for the device classes install.sh cares about
  local compat model arch
  compat="$(readdt compatible)"; model="$(readdt model)"
  if [ -n "$R" ]; then
    if grep -q '^CPU implementer' "$R/proc/cpuinfo" 2>/dev/null; then arch=aarch64
    elif grep -q '^vendor_id' "$R/proc/cpuinfo" 2>/dev/null; then arch=x86_64; else arch="$(uname -m)"; fi
  else arch="$(uname -m)"; fi
  case "$compat" in
    *tegra234*) echo jetson-orin; return ;; *tegra194*) echo jetson-xavier; return ;; *tegra210*) echo jetson-nano; return ;;
  esac
  [ -e "$R/etc/nv_tegra_release" ] && { echo jetson-orin; return; }
  case "$model" in
    *"Raspberry Pi 5"*|*"Compute Module 5"*) echo raspberry-pi-5; return ;;  # also Pi 500
    *"Raspberry Pi 4"*|*"Compute Module 4"*) echo raspberry-pi-4; return ;;  # also Pi 400
  esac
  if [[ "$compat" == *qcom,* ]] || [ -e "$R/dev/fastrpc-cdsp" ]; then echo qualcomm-snapdragon; return; fi
  if [ "$arch" = x86_64 ] && grep -q 'GenuineIntel' "$R/proc/cpuinfo" 2>/dev/null; then echo intel-x86_64; return; fi
  if [ "$arch" = aarch64 ]; then echo generic-aarch64; else echo generic-x86_64; fi
}

target_memory_max() {  # serving.memory_max of targets/NAME.yaml
  local f="$SRC_DIR/targets/$1.yaml"
  [ -r "$f" ] || return 0
  awk '/^serving:/ {s=1; next} /^[^ #]/ {s=0} s && $1 == "memory_max:" {print $2; exit}' "$f"
}

runtime_for() {
  case "$1" in
    jetson-*) echo jetson ;; qualcomm-*) echo qnn ;; intel-*) echo openvino ;; *) echo cpu ;;
  esac
}

manifest_field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

install_release() {  # the first release, laid out as `edge-agent release install` does (agent/release/install.py)
  local man="$RELEASE/release.json" ver deps dest py base nodeps=()
  [ -r "$man" ] || die "--release $RELEASE: no release.json (make one with: edge-agent release build)"
  ver="$(manifest_field "$man" version)" || die "--release: $man is not a release manifest"
  [[ "$ver" =~ ^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$ ]] || die "--release: version '$ver' is not a plain name"
  deps="$(manifest_field "$man" dependencies)"
  dest="$OPT/releases/$ver"
  if [ "$DRY" = 1 ]; then say "would install release $ver in $dest/venv"; return; fi
  if [ -e "$dest/installed.json" ]; then say "release $ver already installed in $dest"; else
    rm -rf "$dest"; mkdir -p "$dest"
    cp -r "$RELEASE" "$dest/wheelhouse"
    python3 - "$man" > "$dest/requirements.txt" <<'PY'
import json, sys
for w in json.load(open(sys.argv[1]))["wheels"]:
    print(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}")
PY
    py=python3 base="$R$VENV_DIR"
    [ -x "$base/bin/python" ] || base="$VENV_DIR"  # under --root: the venv in the tree, else this host's
    if [ "$deps" = base ]; then py="$base/bin/python"; nodeps=(--no-deps); fi
    [ -x "$(command -v "$py")" ] || die "--release $ver has no dependencies: --venv-dir must name a venv with them"
    "$py" -m venv "$dest/venv"
    env -u PYTHONPATH PIP_CONFIG_FILE=/dev/null "$dest/venv/bin/python" -m pip install -q --no-index --require-hashes \
      --find-links "$dest/wheelhouse" -r "$dest/requirements.txt" "${nodeps[@]}" || die "release $ver: pip install failed"
    if [ "$deps" = base ]; then
      "$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
        > "$("$dest/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_edge_agent_base.pth"
    fi
    if [ -n "$TRUST" ]; then  # before anything points at it: a bad signature removes the release again
      env -u PYTHONPATH "$dest/venv/bin/edge-agent" release verify "$dest/wheelhouse" --trust "$TRUST" >/dev/null ||
        { rm -rf "$dest"; die "release $ver: release.json is not signed by $TRUST"; }
    else
      say "warning: no --trust: the signature of release $ver was not checked (every wheel's sha256 was)"
    fi
    echo "{\"version\": \"$ver\", \"installed\": $(date +%s)}" > "$dest/installed.json"
    say "installed release $ver in $dest/venv"
  fi
  if [ ! -L "$OPT/current" ]; then ln -sfn "releases/$ver" "$OPT/.current.tmp"; mv -T "$OPT/.current.tmp" "$OPT/current"; fi
  say "current -> $(readlink "$OPT/current")"
  mkdir -p "$OPT/guard/bin"
  rm -rf "$OPT/guard/bin/agent_guard"
  tar -C "$SRC_DIR" --exclude=__pycache__ -cf - agent_guard | tar -C "$OPT/guard/bin" -xf -
  install -m 0755 "$SRC_DIR/scripts/edge-agent-guard" "$OPT/guard/bin/edge-agent-guard"
  say "installed the guard in /opt/edge-agent/guard/bin (standard library only)"
}

# ------------------------------------------------------------------ uninstall

if [ "$UNINSTALL" = 1 ]; then
  if [ "$SYSTEM" = 1 ] && has_systemctl; then
    run systemctl disable --now "$NAME.service" 2>/dev/null || true
    [ -e "$GUARD_UNIT" ] && { run systemctl disable --now "$NAME-guard.service" 2>/dev/null || true; }
  fi
  for p in "$WANTS" "$UNIT" "$DROPIN" "$GUARD_WANTS" "$GUARD_UNIT"; do
    if [ -e "$p" ] || [ -L "$p" ]; then run rm -f "$p"; say "removed $p"; fi
  done
  [ -d "$UNIT_DIR/$NAME.service.d" ] && run rmdir "$UNIT_DIR/$NAME.service.d" 2>/dev/null || true
  if [ -d "$OPT" ]; then run rm -rf "$OPT"; say "removed $OPT (venv and source)"; fi
  if [ "$PURGE" = 1 ]; then
    for d in "$CONF_DIR" "$STATE" "$CACHE"; do
      if [ -d "$d" ]; then run rm -rf "$d"; say "purged $d"; fi
    done
    if [ "$SYSTEM" = 1 ] && getent passwd "$NAME" >/dev/null; then run userdel "$NAME"; say "removed user $NAME"; fi
  else
    say "kept $CONF_DIR and $STATE (add --purge to remove them)"
  fi
  [ "$SYSTEM" = 1 ] && has_systemctl && run systemctl daemon-reload || true
  say "uninstalled"
  exit 0
fi

# ------------------------------------------------------------------ install

TARGET_SRC="--target"
if [ -z "$TARGET" ]; then TARGET="$(detect_target)"; TARGET_SRC="detected"; fi
[ -r "$SRC_DIR/targets/$TARGET.yaml" ] || die "--target '$TARGET': no $SRC_DIR/targets/$TARGET.yaml"
if [ "$RUNTIME" = auto ]; then
  RUNTIME="$(runtime_for "$TARGET")"
  if [ "$RUNTIME" = jetson ] && ! grep -q '^# R36' "$R/etc/nv_tegra_release" 2>/dev/null; then
    say "warning: not JetPack 6 (L4T R36): no onnxruntime-gpu index known for it; using CPU (or --wheelhouse)"
    RUNTIME=cpu
  fi
fi
say "target: $TARGET ($TARGET_SRC); runtime: $RUNTIME; root: ${R:-/}"

# 1. the system user (hardware access comes from groups, never root)
GROUPS_WANTED="render video"
GROUPS_FOUND=""
for g in $GROUPS_WANTED; do
  if grep -q "^$g:" "${R:-}/etc/group" 2>/dev/null; then GROUPS_FOUND="$GROUPS_FOUND $g"; fi
done
GROUPS_FOUND="${GROUPS_FOUND# }"
if [ "$SYSTEM" = 1 ]; then
  if getent passwd "$NAME" >/dev/null; then say "user $NAME exists"; else
    run useradd --system --user-group --home-dir /var/lib/edge-agent --no-create-home --shell /usr/sbin/nologin "$NAME"
    say "created system user $NAME"
  fi
  for g in $GROUPS_FOUND; do run usermod -aG "$g" "$NAME"; done
fi

# 2. the source (a copy of this release, owned by root)
run mkdir -p "$OPT"
if [ "$DRY" = 0 ]; then
  [ ! -d "$OPT/src" ] && [ -d "$OPT/src.old" ] && mv "$OPT/src.old" "$OPT/src"  # crash between the renames
  rm -rf "$OPT/src.new"
  mkdir -p "$OPT/src.new"
  parts=()
  for p in agent agent_guard targets hwtests pyproject.toml README.md scripts systemd docs; do
    [ -e "$SRC_DIR/$p" ] && parts+=("$p")
  done
  tar -C "$SRC_DIR" --exclude=__pycache__ --exclude='*.egg-info' --exclude=.venv --exclude=.git -cf - "${parts[@]}" \
    | tar -C "$OPT/src.new" -xf -
  # The running daemon imports lazily from $OPT/src: stop it before the swap (restarted at the end).
  if [ "$SYSTEM" = 1 ] && has_systemctl && systemctl is-active --quiet "$NAME.service" 2>/dev/null; then
    run systemctl stop "$NAME.service"
    WAS_ACTIVE=1
  fi
  rm -rf "$OPT/src.old"
  # Two renames with a window between them; a re-run after a crash there finds src.old and recovers it.
  [ -d "$OPT/src" ] && mv "$OPT/src" "$OPT/src.old"
  mv "$OPT/src.new" "$OPT/src"
  rm -rf "$OPT/src.old"
fi
say "installed source in $OPT/src"

# 3. the virtualenv with the runtime for this device
PIP_SRC=()
[ -n "$WHEELHOUSE" ] && PIP_SRC=(--no-index --find-links "$WHEELHOUSE")
if [ -n "$RELEASE" ]; then
  install_release
  VENV_DIR="/opt/edge-agent/current/venv"  # the unit follows the guard's link
elif [ "$VENV_MODE" = 1 ]; then
  V="$R$VENV_DIR"
  py_ok="$(python3 -c 'import sys; print(int(sys.version_info >= (3, 10)))' 2>/dev/null || echo 0)"
  [ "$py_ok" = 1 ] || die "python3 >= 3.10 is required (found: $(python3 --version 2>&1 || echo none))"
  # python3-venv (ensurepip) only to create the venv: an existing one brings its own pip.
  if [ ! -x "$V/bin/python" ] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    [ "$SYSTEM" = 1 ] || die "python3-venv is missing (apt-get install python3-venv)"
    run apt-get install -y -qq python3-venv
  fi
  [ -x "$V/bin/python" ] || { run python3 -m venv "$V"; say "created venv $V"; }
  extras=""
  case "$RUNTIME" in openvino) extras="[openvino,ort-openvino]" ;; esac
  run "$V/bin/python" -m pip install -q "${PIP_SRC[@]}" --upgrade pip
  run "$V/bin/python" -m pip install -q "${PIP_SRC[@]}" -e "$OPT/src$extras"
  case "$RUNTIME" in
    jetson)
      "$V/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' ||
        say "warning: the JetPack 6 index has cp310 wheels; this venv's Python is not 3.10"
      if [ -n "$WHEELHOUSE" ]; then jidx=("${PIP_SRC[@]}"); else jidx=(--index-url "$JETSON_INDEX"); fi
      run "$V/bin/python" -m pip uninstall -y -q onnxruntime
      # --force-reinstall: on a re-run, `pip install -e` put CPU onnxruntime back over onnxruntime-gpu's shared files
      run "$V/bin/python" -m pip install -q --force-reinstall --no-deps "${jidx[@]}" onnxruntime-gpu ;;
    qnn)
      if "$V/bin/python" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
        run "$V/bin/python" -m pip install -q "${PIP_SRC[@]}" onnxruntime-qnn
      else
        say "warning: onnxruntime-qnn has Linux aarch64 wheels for Python 3.11-3.13 only; staying on CPU"
      fi ;;
  esac
  # Byte-compile the source now, as root: the service user cannot write into root-owned $OPT/src, so without
  # this every process it starts (each qualification worker) compiles the agent's modules again.
  run "$V/bin/python" -m compileall -q "$OPT/src/agent" || say "warning: byte-compiling $OPT/src failed"
  say "venv $V ready ($RUNTIME runtime)"
else
  if [ -x "$R$VENV_DIR/bin/edge-agent" ]; then say "using existing venv $VENV_DIR"
  else say "venv: skipped (--no-venv); the unit runs $VENV_DIR/bin/edge-agent, create it with --venv"; fi
fi

# 4. the configuration (never overwritten)
run mkdir -p "$CONF_DIR"
if [ -e "$CONF" ]; then
  say "kept existing $CONF"
else
  [ -n "$DEVICE_ID" ] || DEVICE_ID="$(device_id)"
  if [ -n "$DEVICE_ID" ]; then idline="device_id: $DEVICE_ID"
  else idline="# device_id: not found at install time; the agent derives it at start-up (or set it here)"; fi
  if [ "$DRY" = 0 ]; then
    { echo "# Written by install.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ); edit freely, re-running install.sh keeps it."
      echo "$idline"
      grep -v '^# device_id:' "$SRC_DIR/systemd/agent.yaml"
    } > "$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
  fi
  say "wrote $CONF (${idline})"
fi

# 5. state and cache directories (systemd's StateDirectory= also creates them at start)
for d in "$STATE" "$CACHE"; do run mkdir -p "$d"; run chmod 0750 "$d"; done
if [ "$SYSTEM" = 1 ]; then
  run chown -R "$NAME:$NAME" "$STATE" "$CACHE"
  run chown root:"$NAME" "$CONF_DIR" "$CONF"
fi
run chmod 0750 "$CONF_DIR"
[ "$DRY" = 1 ] || chmod 0640 "$CONF"
say "state in /var/lib/edge-agent, cache in /var/cache/edge-agent"

# 6. the unit and this device's drop-in
MEM="$(target_memory_max "$TARGET")"
run mkdir -p "$UNIT_DIR/$NAME.service.d"
if [ "$DRY" = 0 ]; then
  sed "s#/opt/edge-agent/venv#$VENV_DIR#g" "$SRC_DIR/systemd/$NAME.service" > "$UNIT.tmp"
  chmod 0644 "$UNIT.tmp"; mv "$UNIT.tmp" "$UNIT"
  { echo "# Written by install.sh for target $TARGET; re-run install.sh to regenerate, or override in 20-*.conf."
    echo "[Service]"
    echo "MemoryMax=${MEM:-80%}"
    [ -n "$GROUPS_FOUND" ] && echo "SupplementaryGroups=$GROUPS_FOUND"
  } > "$DROPIN.tmp"
  chmod 0644 "$DROPIN.tmp"; mv "$DROPIN.tmp" "$DROPIN"
fi
say "installed $UNIT and $DROPIN (MemoryMax=${MEM:-80%}${GROUPS_FOUND:+, groups: $GROUPS_FOUND})"
if [ -n "$RELEASE" ]; then  # the guard trials each later release (docs/self-update.md, "Under systemd")
  [ "$DRY" = 1 ] || install -m 0644 "$SRC_DIR/systemd/$NAME-guard.service" "$GUARD_UNIT"
  say "installed $GUARD_UNIT"
fi

# 7. enable and start
if [ "$NO_SYSTEMD" = 1 ]; then
  START=0
elif [ "$SYSTEM" = 1 ] && [ ! -d /run/systemd/system ] && [ "$DRY" = 0 ]; then
  say "warning: systemd is not running here (container?): not enabling or starting the service"
  ENABLE=0 START=0
fi
if [ "$ENABLE" = 1 ]; then
  if [ "$SYSTEM" = 1 ] && [ "$NO_SYSTEMD" = 0 ]; then
    run systemctl daemon-reload
    run systemctl enable "$NAME.service"
    [ -z "$RELEASE" ] || run systemctl enable "$NAME-guard.service"
  else
    run mkdir -p "$(dirname "$WANTS")"
    run ln -sfn "/etc/systemd/system/$NAME.service" "$WANTS"
    [ -z "$RELEASE" ] || run ln -sfn "/etc/systemd/system/$NAME-guard.service" "$GUARD_WANTS"
  fi
  say "enabled $NAME.service (multi-user.target)"
fi
if [ "$SYSTEM" = 1 ] && { [ "$START" = 1 ] || [ "${WAS_ACTIVE:-0}" = 1 ]; }; then
  [ -z "$RELEASE" ] || run systemctl restart "$NAME-guard.service"
  run systemctl restart "$NAME.service"
  say "started $NAME.service: journalctl -u $NAME -f"
fi
[ "$NO_SYSTEMD" = 0 ] || say "no systemd here (--no-systemd): start the agent with ${VENV_DIR}/bin/edge-agent run --config /etc/edge-agent/agent.yaml"
say "done. Check the config: ${VENV_DIR}/bin/edge-agent config check /etc/edge-agent/agent.yaml"
