#!/usr/bin/env bash
# edge-agent end to end on this machine, in a few minutes, leaving nothing running:
#   venv -> private Mosquitto (or local inbox mode) -> keys (fleet; the device's, registered) -> agent -> push a
#   generated model -> qualified, active -> one inference over HTTP (KServe v2) -> the provider decision -> stop all.
#   bash scripts/quickstart.sh [--local] [--keep] [--model cnn|tiny]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${EDGE_AGENT_VENV:-$ROOT/.venv}"
MODE=auto KEEP=0 MODEL=cnn TIMEOUT="${QUICKSTART_TIMEOUT:-600}"
while [ $# -gt 0 ]; do
  case "$1" in
    --local) MODE=local ;;
    --keep) KEEP=1 ;;
    --model) MODEL="${2:?--model needs cnn or tiny}"; shift ;;
    -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quickstart.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$MODEL" in cnn|tiny) ;; *) echo "quickstart.sh: --model: expected cnn or tiny" >&2; exit 2 ;; esac

step() { echo; echo "==> $*"; }
info() { echo "    $*"; }
fail() {  # fail MESSAGE [LOG]: the message, then the last lines of LOG (default: the agent's log, when there is one)
  local log="${2:-${WORK:-/nonexistent}/agent.log}"
  echo "quickstart.sh: error: $1" >&2
  [ -s "$log" ] && { echo "--- $(basename "$log") (last 30 lines) ---" >&2; tail -30 "$log" >&2; }
  exit 1
}

# ---------------------------------------------------------------- 1. the virtualenv (as scripts/test.sh)
step "Python environment: $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    info "installing python3-venv with apt-get"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  python3 -m venv "$VENV"
  info "created $VENV"
fi
if "$VENV/bin/python" -c 'import agent.cli, onnxruntime, paho.mqtt, yaml' >/dev/null 2>&1 && [ -x "$VENV/bin/edge-agent" ]; then
  info "edge-agent $("$VENV/bin/edge-agent" --version | awk '{print $NF}') already installed"
else
  info "installing edge-agent and its runtime (pip, once; a minute or two)"
  PIPLOG="$(mktemp)"
  if ! { "$VENV/bin/python" -m pip install -q --upgrade pip && "$VENV/bin/python" -m pip install -q -e .; } > "$PIPLOG" 2>&1; then
    tail -30 "$PIPLOG" >&2; rm -f "$PIPLOG"; fail "pip install failed"
  fi
  rm -f "$PIPLOG"
fi
EA="$VENV/bin/edge-agent"
PY="$VENV/bin/python"

# ---------------------------------------------------------------- workspace and cleanup of everything we start
WORK="$(mktemp -d "${TMPDIR:-/tmp}/edge-agent-quickstart.XXXXXX")"
PIDS=()
cleanup() {
  local rc=$?
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "$KEEP" = 1 ]; then echo "    kept $WORK"; else rm -rf "$WORK"; fi
  [ $rc -eq 0 ] && echo && echo "Done: everything the quickstart started is stopped."
}
trap cleanup EXIT
trap 'exit 130' INT TERM
WATCH=()  # "pid|what|log" of every process the later steps depend on: checked while anything is awaited
started() { PIDS+=("$1"); WATCH+=("$1|$2|$3"); }  # started PID WHAT LOG
check_alive() {  # fail, with the last lines of its log, as soon as a process we started has exited
  local w pid what log
  for w in ${WATCH[@]+"${WATCH[@]}"}; do
    IFS='|' read -r pid what log <<< "$w"
    kill -0 "$pid" 2>/dev/null || fail "$what (pid $pid) exited" "$log"
  done
}
watched() {  # watched OUT CMD...: CMD in the background (output to file OUT, or here for -); fail within a second
  local out="$1" pid  # when a process we started exits meanwhile (naming it, with its log)
  shift
  if [ "$out" = - ]; then "$@" <&0 & else "$@" <&0 > "$out" 2>&1 & fi  # stdin stays ours: a here-document
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if ! (check_alive) 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
      check_alive  # names what exited and shows its log
    fi
    sleep 0.5
  done
  wait "$pid"
}
wait_log() {  # wait_log PATTERN LOG: LINE = the first line of LOG matching PATTERN, once it appears (while all live)
  for _ in $(seq $((TIMEOUT * 5))); do
    LINE="$(grep -m1 -E "$1" "$2" 2>/dev/null || true)"
    [ -n "$LINE" ] && return 0
    check_alive
    sleep 0.2
  done
  fail "no line matching '$1' in $2 after $TIMEOUT s" "$2"
}

# ---------------------------------------------------------------- 2. broker or local inbox
MOSQ="$(command -v mosquitto || true)"; [ -n "$MOSQ" ] || { [ -x /usr/sbin/mosquitto ] && MOSQ=/usr/sbin/mosquitto; } || true
if [ "$MODE" = auto ]; then if [ -n "$MOSQ" ]; then MODE=mqtt; else MODE=local; fi; fi
if [ "$MODE" = mqtt ]; then
  step "Private Mosquitto broker"
  for attempt in 1 2 3; do  # mosquitto cannot take port 0: a free port, another one if it was taken meanwhile
    MQ_PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$MQ_PORT" > "$WORK/mosquitto.conf"
    "$MOSQ" -c "$WORK/mosquitto.conf" > "$WORK/mosquitto.log" 2>&1 &
    MQ_PID=$!
    for _ in $(seq 100); do
      kill -0 "$MQ_PID" 2>/dev/null || break
      "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $MQ_PORT), 0.2)" 2>/dev/null && break
      sleep 0.1
    done
    kill -0 "$MQ_PID" 2>/dev/null && break
    [ "$attempt" = 3 ] && fail "mosquitto exited at start-up (port $MQ_PORT)" "$WORK/mosquitto.log"
  done
  started "$MQ_PID" mosquitto "$WORK/mosquitto.log"
  BROKER="mqtt://127.0.0.1:$MQ_PORT"
  info "$BROKER (mosquitto pid $MQ_PID)"
  step "Fleet signing keys"
  "$EA" keys generate --out "$WORK/keys" | sed 's/^/    /'
elif [ -n "$MOSQ" ]; then
  step "Local inbox mode (--local: no broker; packages are moved into the agent's inbox)"
else
  step "Local inbox mode (no mosquitto installed: apt-get install mosquitto for the MQTT path)"
fi

# ---------------------------------------------------------------- 3. the agent
step "Starting the agent"
DEVICE=quickstart-device
{
  echo "device_id: $DEVICE"
  echo "groups: [quickstart]"
  echo "state_dir: $WORK/state"
  echo "serving: {host: 127.0.0.1, port: 0}"  # 0: free ports for HTTP and gRPC, chosen by the daemon
  echo "telemetry: {interval_s: 10}"
  if [ "$MODE" = mqtt ]; then
    echo "mqtt: {url: '$BROKER', topic_prefix: edge}"
    echo "trust: {public_keys: ['$WORK/keys/fleet.pub']}"
  else
    echo "inbox: $WORK/inbox"
  fi
} > "$WORK/agent.yaml"
CHECK="$("$EA" config check "$WORK/agent.yaml")" || fail "the generated config does not validate"
echo "$CHECK" | sed -n '1,3s/^/    /p'
if [ "$MODE" = mqtt ]; then
  # The device signs its status with its own key; the control plane believes only keys in its registry
  # (fleet push --wait refuses to wait without one). On a real device: `edge-agent keys device` at install.
  DEVKEY="$("$EA" keys device --config "$WORK/agent.yaml" --json)" || fail "edge-agent keys device failed"
  DEVPUB="$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["public_key_file"])' "$DEVKEY")"
  REG="$("$EA" fleet register "$DEVICE" --public-key "$DEVPUB" --group quickstart --store "$WORK/cp-store")" \
    || fail "edge-agent fleet register failed"
  info "$REG"
fi
# A short probation so the demo commits quickly (production default: 60 s).
EDGE_AGENT_PROBATION_S="${EDGE_AGENT_PROBATION_S:-5}" "$EA" run --config "$WORK/agent.yaml" > "$WORK/agent.log" 2>&1 &
AGENT_PID=$!
started "$AGENT_PID" "the agent" "$WORK/agent.log"
# its `ready` event (logged once it serves) names the URL it bound; a daemon that exits is noticed at once
wait_log '^ready url=' "$WORK/agent.log"
URL="$(echo "$LINE" | sed -E 's/^ready url=([^ ]+).*/\1/')"
info "agent pid $AGENT_PID serving the KServe v2 API on $URL (log: $WORK/agent.log)"

# ---------------------------------------------------------------- 4. a generated sample model, pushed
step "Generating a sample model package ($MODEL) and deploying it"
"$PY" - "$WORK/pkg" "$MODEL" <<'EOF'
import sys
from agent.samples import sample_cnn_package, sample_tiny_package
make = sample_cnn_package if sys.argv[2] == "cnn" else sample_tiny_package
make(sys.argv[1], name="sample-" + sys.argv[2], version="1")
EOF
NAME="sample-$MODEL"
if [ "$MODE" = mqtt ]; then
  "$EA" fleet serve --store "$WORK/cp-store" --broker "$BROKER" > "$WORK/artifact-server.log" 2>&1 &
  started "$!" "the artifact server" "$WORK/artifact-server.log"
  info "artifact server pid $! (answers chunk requests over MQTT)"
  if ! watched "$WORK/push.log" "$EA" fleet push "$WORK/pkg" --name "$NAME" --version 1 --device "$DEVICE" \
      --key "$WORK/keys/fleet.key" --store "$WORK/cp-store" --broker "$BROKER" --wait "$TIMEOUT"; then
    sed 's/^/    /' "$WORK/push.log"
    fail "fleet push --wait did not see $NAME 1 committed"
  fi
  sed 's/^/    /' "$WORK/push.log"
else
  mkdir -p "$WORK/inbox/$NAME" "$WORK/inbox/.incoming"
  cp -r "$WORK/pkg" "$WORK/inbox/.incoming/1"
  mv "$WORK/inbox/.incoming/1" "$WORK/inbox/$NAME/1"   # atomic rename into the inbox
  info "moved the package into $WORK/inbox/$NAME/1; waiting for it to be qualified and committed"
  watched - "$PY" - "$EA" "$WORK/agent.yaml" "$NAME" "$TIMEOUT" <<'EOF' || fail "$NAME was not committed"
import json, subprocess, sys, time
ea, conf, name, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
deadline, last = time.monotonic() + timeout, None
while time.monotonic() < deadline:
    doc = json.loads(subprocess.run([ea, "status", "--config", conf, "--json"], capture_output=True, text=True).stdout or "{}")
    model, dep = (doc.get("models") or {}).get(name) or {}, (doc.get("deployments") or {}).get(name) or {}
    state = model.get("state") if model.get("version") == "1" else dep.get("state")
    if state != last:
        print(f"    {name} 1: {state or 'waiting'}", flush=True)
        last = state
    if state == "committed":
        sys.exit(0)
    if state in ("failed", "rolled_back", "rejected"):
        print(f"    reason: {dep.get('reason')}", flush=True)
        sys.exit(1)
    time.sleep(1)
sys.exit(f"timed out after {timeout:.0f} s in state {last}")
EOF
fi

# ---------------------------------------------------------------- 5. one inference through the HTTP API
step "One inference through the HTTP API (KServe v2 / Open Inference Protocol)"
"$PY" - "$URL" "$NAME" "$WORK/pkg" <<'EOF' || fail "inference failed"
import json, sys, time, urllib.request
from pathlib import Path
import numpy as np
from onnx import TensorProto, numpy_helper
url, name, pkg = sys.argv[1], sys.argv[2], Path(sys.argv[3])
meta = json.load(urllib.request.urlopen(f"{url}/v2/models/{name}", timeout=30))
ds = pkg / "test_data_set_0"
def load(p):
    t = TensorProto(); t.ParseFromString(p.read_bytes()); return numpy_helper.to_array(t)
x, golden = load(ds / "input_0.pb"), load(ds / "output_0.pb")
inp = meta["inputs"][0]
body = {"inputs": [{"name": inp["name"], "shape": list(x.shape), "datatype": inp["datatype"], "data": x.ravel().tolist()}]}
req = urllib.request.Request(f"{url}/v2/models/{name}/infer", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
t0 = time.perf_counter()
resp = json.load(urllib.request.urlopen(req, timeout=60))
ms = (time.perf_counter() - t0) * 1000
out = resp["outputs"][0]
y = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
print(f"    POST {url}/v2/models/{name}/infer -> model_version {resp.get('model_version')}, "
      f"output {out['name']} {out['shape']} in {ms:.1f} ms (HTTP round trip)")
if name.endswith("cnn"):  # a classifier: show the class it picked
    print(f"    predicted class {int(y.argmax())} (golden: {int(golden.argmax())})")
print(f"    max |output - golden reference| = {float(np.abs(y - golden).max()):.3g}")
EOF

# ---------------------------------------------------------------- 6. the decision and its evidence
step "Provider decision (from edge-agent status --json and the decision record)"
# the usable providers come from the daemon's background probe (a child that opens a session on each): wait for it
for _ in $(seq "$TIMEOUT"); do
  "$EA" status --config "$WORK/agent.yaml" --json > "$WORK/status.json" || fail "edge-agent status failed"
  "$PY" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("providers_source") == "pending")' \
    "$WORK/status.json" && break
  check_alive
  sleep 1
done
"$PY" - "$WORK/status.json" "$WORK/state" "$NAME" <<'EOF'
import json, sys
from pathlib import Path
from agent.cli.table import render_table
doc, state, name = json.load(open(sys.argv[1])), Path(sys.argv[2]), sys.argv[3]
m = (doc.get("models") or {}).get(name, {})
print(f"    device {doc.get('device_id')}  target {doc.get('target')}  hardware {json.dumps(doc.get('hardware'))}")
print(f"    usable providers here: {', '.join(doc.get('providers') or []) or '?'}")
print(f"    {name} v{m.get('version')}: state {m.get('state')}, provider {m.get('provider')}, precision {m.get('precision')}")
dep_id = ((doc.get("deployments") or {}).get(name) or {}).get("id") or m.get("deployment_id")
rec = state / "decisions" / f"{dep_id}.json"
if not rec.is_file():
    recs = sorted((state / "decisions").glob("*.json"), key=lambda p: p.stat().st_mtime)
    rec = recs[-1] if recs else None
if rec is None:
    sys.exit("    no decision record found")
d = json.loads(rec.read_text())
print(f"    decision record: {rec}")
rows = []
for r in d.get("results", []):
    acc, lat = r.get("accuracy") or {}, r.get("latency_ms") or {}
    f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) else None
    rows.append((r.get("provider", "?"), r.get("precision"), r.get("status", "?"), f(r.get("coverage"), ".0%"),
                 f(acc.get("max_rel"), ".2g"), f(lat.get("p50"), ".3f"), f(lat.get("p99"), ".3f"), r.get("reason") or ""))
header = ("PROVIDER", "PRECISION", "STATUS", "COVERAGE", "MAX_REL", "P50 ms", "P99 ms", "REASON")
print(render_table(header, rows, indent="    ", right=(3, 4, 5, 6)))  # columns as wide as their widest cell
print(f"    selected: {d.get('selected')} ({d.get('selected_precision') or 'default precision'}): {d.get('reason')}")
EOF

if [ "$MODE" = mqtt ]; then
  step "The fleet as the control plane sees it (edge-agent fleet status)"
  "$EA" fleet status --broker "$BROKER" --store "$WORK/cp-store" 2>&1 | sed 's/^/    /' || true
fi
