#!/bin/sh
# Capture the files `edge-agent profile` reads into a small tarball, so a device we do not have can be
# profiled (and added to agent/sysroots) with `edge-agent profile --sysroot FILE.tar.gz`.
#
#   sh capture-sysroot.sh [OUTPUT.tar.gz]      # run on the device; needs only a POSIX shell and tar
#
# What it captures (text only, each file capped at 1 MiB, paths kept as on the device):
#   /proc/cpuinfo, /proc/meminfo, /proc/sys/kernel/osrelease, /proc/device-tree/{model,compatible},
#   /etc/os-release, /etc/nv_tegra_release (+ nvpmodel status/conf), /sys/class/devfreq/*,
#   /sys/class/drm/*/device/{vendor,device}, /sys/class/accel/*, /sys/devices/soc0/*, the Adreno gpu_model,
#   the Raspberry Pi firmware's get_throttled, thermal zones, DMI vendor/product names, PCI and USB vendor/device ids.
#   Device nodes (/dev/hailo0, /dev/apex_0, /dev/accel/*, /dev/dri/*, /dev/fastrpc-*, Jetson GPU nodes)
#   become empty regular files.
# macOS: `sysctl -a` is saved as .captures/sysctl.txt ("key: value" lines; `profile --sysroot` reads it),
#   plus `sw_vers` in .captures/sw_vers.txt.
# Privacy: the Pi serial number is zeroed; hostnames, UUIDs and serial numbers are not captured.
# .captures/info.txt: captured (UTC), uname, tool, anonymised (the rule above), one "key: value" a line; the
#   fixtures in agent/sysroots hold the same layout and keys (agent/sysroots/README.md).
set -eu

case "${1:-}" in -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ANONYMISED="cpuinfo Serial zeroed; no hostname, machine-id, UUID or serial-number file captured"
OUT=${1:-edge-agent-sysroot-$(date +%Y%m%d-%H%M%S).tar.gz}
case "$OUT" in /*) ;; *) OUT="$(pwd)/$OUT" ;; esac
TMP=$(mktemp -d 2>/dev/null || mktemp -d -t edge-agent-capture)
trap 'rm -rf "$TMP"' EXIT INT TERM
ROOT="$TMP/sysroot"
mkdir -p "$ROOT/.captures"
COUNT=0

copy() {  # copy readable regular files (following links), keeping their path under ROOT
  for f in "$@"; do
    [ -f "$f" ] && [ -r "$f" ] || continue
    mkdir -p "$ROOT$(dirname "$f")"
    if head -c 1048576 "$f" > "$ROOT$f" 2>/dev/null; then COUNT=$((COUNT + 1)); else rm -f "$ROOT$f"; fi
  done
}

node() {  # device nodes become empty regular files
  for f in "$@"; do
    [ -e "$f" ] || continue
    mkdir -p "$ROOT$(dirname "$f")"
    : > "$ROOT$f"
    COUNT=$((COUNT + 1))
  done
}

if [ "$(uname -s)" = "Darwin" ]; then
  sysctl -a 2>/dev/null | grep -v -E '^(kern\.hostname|kern\.uuid|kern\.bootsessionuuid|kern\.bootargs|kern\.hostuuid|machdep\.cpu\.serial)' \
    > "$ROOT/.captures/sysctl.txt" || true
  sw_vers > "$ROOT/.captures/sw_vers.txt" 2>/dev/null || true
  COUNT=$((COUNT + 2))
else
  copy /proc/cpuinfo /proc/meminfo /proc/sys/kernel/osrelease
  if [ -f "$ROOT/proc/cpuinfo" ]; then  # zero the Raspberry Pi serial number
    sed 's/^\(Serial[[:space:]]*:[[:space:]]*\).*/\10000000000000000/' "$ROOT/proc/cpuinfo" > "$TMP/cpuinfo" \
      && mv "$TMP/cpuinfo" "$ROOT/proc/cpuinfo"
  fi
  copy /proc/device-tree/model /proc/device-tree/compatible
  copy /etc/os-release /usr/lib/os-release /etc/nv_tegra_release /etc/nvpmodel.conf /var/lib/nvpmodel/status
  copy /sys/class/devfreq/*/device/of_node/name /sys/class/devfreq/*/device/load /sys/class/devfreq/*/cur_freq
  copy /sys/class/drm/*/device/vendor /sys/class/drm/*/device/device
  copy /sys/class/accel/*/device/vendor /sys/class/accel/*/device/device /sys/class/accel/*/device/uevent
  copy /sys/devices/soc0/machine /sys/devices/soc0/family /sys/devices/soc0/soc_id /sys/devices/soc0/revision \
       /sys/devices/soc0/vendor /sys/class/kgsl/kgsl-3d0/gpu_model
  copy /sys/devices/platform/soc/soc:firmware/get_throttled /sys/devices/platform/*/*firmware*/get_throttled
  copy /sys/class/thermal/thermal_zone*/type /sys/class/thermal/thermal_zone*/temp
  copy /sys/class/dmi/id/sys_vendor /sys/class/dmi/id/product_name /sys/class/dmi/id/product_version \
       /sys/class/dmi/id/board_vendor \
       /sys/class/dmi/id/board_name /sys/class/dmi/id/bios_version
  copy /sys/bus/pci/devices/*/vendor /sys/bus/pci/devices/*/device /sys/bus/pci/devices/*/class
  copy /sys/bus/usb/devices/*/idVendor /sys/bus/usb/devices/*/idProduct
  node /dev/hailo* /dev/apex_* /dev/accel/accel* /dev/dri/renderD* /dev/dri/card* /dev/fastrpc-* \
       /dev/adsprpc-smd /dev/nvhost-gpu /dev/nvgpu/igpu0/ctrl /dev/kgsl-3d0
  # Reference only (profile does not read these): what the vendor tools say, where they exist.
  if command -v vcgencmd >/dev/null 2>&1; then vcgencmd get_throttled > "$ROOT/.captures/vcgencmd.txt" 2>/dev/null || true; fi
  if command -v nvpmodel >/dev/null 2>&1; then nvpmodel -q > "$ROOT/.captures/nvpmodel.txt" 2>/dev/null || true; fi
fi
{
  echo "captured: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "uname: $(uname -srm)"
  echo "tool: edge-agent capture-sysroot.sh 1"
  echo "anonymised: $ANONYMISED"
} > "$ROOT/.captures/info.txt"

tar -czf "$OUT" -C "$ROOT" .
echo "wrote $OUT ($COUNT files). Check it with: edge-agent profile --sysroot $OUT" >&2
