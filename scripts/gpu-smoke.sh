#!/usr/bin/env bash
# gpu-smoke.sh — run gpuhost against a REAL NVIDIA driver (no systemd, no
# inference server needed): doctor locally, then a daemon with the real NVML
# backend and simulator backends as child processes, its status, a switch,
# /metrics, the MCP gpu tool, the agent loop (`gpuhost ask`) and the mail
# triage worker on the sample mails (energy cost from the real power). Usage: scripts/gpu-smoke.sh [path/to/gpuhost]
# Build the binary with cgo first: make build-gpu (needs gcc).
#
# Then, as root on a host with systemd as PID 1, a REAL fenced vLLM: the
# backend units rendered by `gpuhost units render` (PrivateNetwork=yes, the
# offline settings) are loaded as transient units under /run/systemd/system
# (gone at reboot, removed at exit), a daemon switches to a small vLLM profile
# from the backend user's cache, to an Ollama profile and back through
# standby (vLLM sleeps, Ollama unloads), and prints the switch timings, the
# wake check and the doctor. It is skipped, saying why, where vllm, ollama,
# the backend user or the model is missing (the doctor names the fetch
# command). Settings (environment): VLLM_BIN (default: vllm on PATH),
# VLLM_MODEL (Qwen/Qwen3-0.6B), OLLAMA_BIN (ollama on PATH), OLLAMA_MODEL
# (qwen2.5:0.5b), BACKEND_USER (gpuhost-backend), REAL_PORT (18981).
set -u
BIN=${1:-bin/gpuhost}
BIN=$(readlink -f "$BIN")
if grep -qa 'gpuhost was built without cgo' "$BIN"; then
  echo "gpu-smoke.sh: $BIN was built without cgo (make build / make demo) and cannot use the NVIDIA driver; build it with: make build-gpu" >&2
  exit 1
fi
W=$(mktemp -d)
PORT=${PORT:-18980}
DPID=; RPID=; REAL_UNITS=(); REAL_DIR=
cleanup() {
  [ -n "$DPID" ] && kill "$DPID" 2>/dev/null
  [ -n "$RPID" ] && kill "$RPID" 2>/dev/null
  wait 2>/dev/null
  if [ "${#REAL_UNITS[@]}" -gt 0 ]; then
    systemctl stop "${REAL_UNITS[@]}" 2>/dev/null
    for u in "${REAL_UNITS[@]}"; do rm -f "/run/systemd/system/$u"; done
    systemctl daemon-reload
  fi
  [ -n "$REAL_DIR" ] && rm -rf "$REAL_DIR"
  rm -rf "$W"
}
trap cleanup EXIT
cat >"$W/gpuhost.yaml" <<YAML
listen: "127.0.0.1:$PORT"
state_dir: "$W/state"
gpu:
  backend: nvml
  release_timeout: 20s
systemd:
  runner: process
backends:
  vllm:
    unit: gpuhost-vllm.service
    exec: ["$BIN", simulate, vllm, --scripted-tools]
    simulated: true
  ollama:
    unit: gpuhost-ollama.service
    exec: ["$BIN", simulate, ollama, --scripted-tools]
    simulated: true
default_profile: qwen3-coder
triage:
  enabled: true
  interval: 2s
  first_run: all
  source: {kind: maildir, maildir: "$W/maildir"}
  rules: {priority_mailboxes: [urgent@ourcompany.example], internal_domains: [ourcompany.example]}
  costs: {currency: EUR, energy_per_kwh: 0.30, transcription_per_minute: 0.006}
mcp:
  connectors:
    gpu: {}
    inference: {}
profiles:
  qwen3-coder:
    backend: vllm
    model: cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit
    served_name: qwen3-coder
    port: 18000
    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, max_model_len: 65536, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}
    model_params: {total_params_b: 30.5, active_params_b: 3.3, weight_bits: 4, layers: 48, kv_heads: 4, head_dim: 128, kv_bytes: 2}
    sim: {load_time: 500ms, prefill_tps: 2545, decode_tps: 150}
  llama3-8b:
    backend: ollama
    model: llama3.1:8b
    served_name: llama3.1:8b
    port: 18434
    ollama: {num_ctx: 8192, keep_alive: "-1"}
    sim: {load_time: 300ms, prefill_tps: 4000, decode_tps: 120}
YAML
step() { echo; echo "=== $*"; }
# The sample mails of the demo (repository checkout) as a Maildir.
MAILS=$(dirname "$(readlink -f "$0")")/../triage/demo/mails
mkdir -p "$W/maildir/new" "$W/maildir/cur" "$W/maildir/tmp"
i=0; for f in "$MAILS"/*.eml; do i=$((i+1)); cp "$f" "$W/maildir/new/$((1796025600+i*60)).M${i}P1.smoke"; done
step "nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,power.draw,clocks.max.memory --format=csv 2>&1 | head -5
step "gpuhost version"; "$BIN" version
step "gpuhost doctor --json (local, real NVML)"; "$BIN" --config "$W/gpuhost.yaml" doctor --json; echo "exit=$?"
step "gpuhost serve (real NVML, simulator backends)"
"$BIN" --config "$W/gpuhost.yaml" serve >"$W/serve.log" 2>&1 &
DPID=$!
active() { curl -sf "http://127.0.0.1:$PORT/api/status" | grep -q '"phase": *"active"'; }
for _ in $(seq 200); do active && break; sleep 0.1; done
step "gpuhost status --json"; "$BIN" --config "$W/gpuhost.yaml" status --json; echo "exit=$?"
step "gpuhost switch llama3-8b"; "$BIN" --config "$W/gpuhost.yaml" switch llama3-8b; echo "exit=$?"
step "gpuhost switch qwen3-coder"; "$BIN" --config "$W/gpuhost.yaml" switch qwen3-coder; echo "exit=$?"
step "/metrics (DCGM names)"; curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^DCGM_FI_' | head -20
step "gpuhost ask (agent loop, real NVML behind gpu_status)"; "$BIN" --config "$W/gpuhost.yaml" ask "what is the GPU status?"; echo "exit=$?"
step "triage results (energy from real NVML power)"
for _ in $(seq 100); do n=$(curl -s "http://127.0.0.1:$PORT/api/triage" | grep -o '"uid":' | wc -l); [ "$n" -ge 6 ] && break; sleep 0.3; done
curl -s "http://127.0.0.1:$PORT/api/triage" | python3 -c '
import json,sys
d=json.load(sys.stdin)
for r in d["results"]:
    c=r["cost"]
    print(r["uid"], r["class"], r["importance"], r.get("rule",""), "energy_wh=%.4f" % c.get("energy_wh",0), "total=%.6f %s" % (c["total"], c["currency"]), r["subject"])
'
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^gpuhost_triage_(energy|mails|cost)' | head
step "gpuhost mcp test (gpu, inference)"; "$BIN" --config "$W/gpuhost.yaml" mcp test; echo "exit=$?"
step "hardened units: NVML under the sandboxes that gpuhost units render writes (systemd-run)"
if [ "$(id -u)" -eq 0 ] && [ "$(ps -o comm= -p 1)" = systemd ]; then
  "$BIN" units render --config "$W/gpuhost.yaml" --binary "$BIN" --dir "$W/units" >/dev/null
  # The settings after "# --- Sandbox ---" as systemd-run properties (not User=/paths:
  # the smoke test's files live under /tmp and maybe a home directory).
  props() { sed -n '/^# --- Sandbox ---/,$p' "$1" | grep -E '^[A-Za-z]+=' | grep -vE '^(User|ReadWritePaths|WantedBy)=' | sed 's/^/-p/'; }
  relax=(-pPrivateTmp=no -pProtectHome=read-only)
  mapfile -t bp < <(props "$W/units/gpuhost-vllm.service")
  systemd-run --wait --pipe --quiet "${bp[@]}" "${relax[@]}" nvidia-smi -L; echo "backend sandbox, nvidia-smi: exit=$?"
  mapfile -t dp < <(props "$W/units/gpuhost.service")
  systemd-run --wait --pipe --quiet "${dp[@]}" "${relax[@]}" "-pReadWritePaths=$W" "$BIN" --config "$W/gpuhost.yaml" doctor --json | head -c 600; echo; echo "daemon sandbox, doctor (NVML): exit=${PIPESTATUS[0]}"
else
  echo "skipped: needs root and systemd as PID 1"
fi
step "serve log (tail)"; tail -20 "$W/serve.log"
kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=

step "REAL fenced vLLM under systemd: standby switches vLLM -> Ollama -> vLLM"
real_fenced_vllm() {
  local vllm_bin=${VLLM_BIN:-$(command -v vllm)} ollama_bin=${OLLAMA_BIN:-$(command -v ollama)}
  local model=${VLLM_MODEL:-Qwen/Qwen3-0.6B} omodel=${OLLAMA_MODEL:-qwen2.5:0.5b}
  local buser=${BACKEND_USER:-gpuhost-backend} rport=${REAL_PORT:-18981}
  if [ "$(id -u)" -ne 0 ] || [ "$(ps -o comm= -p 1)" != systemd ]; then echo "skipped: needs root and systemd as PID 1"; return 0; fi
  if [ -z "$vllm_bin" ] || [ -z "$ollama_bin" ]; then echo "skipped: vllm ($vllm_bin) or ollama ($ollama_bin) not found: set VLLM_BIN / OLLAMA_BIN"; return 0; fi
  if ! getent passwd "$buser" >/dev/null; then echo "skipped: backend user $buser does not exist (scripts/install.sh creates it)"; return 0; fi
  # Not under /tmp: the backend unit's private /tmp would hide its environment file.
  local R=/run/gpuhost-smoke
  REAL_DIR=$R
  mkdir -p "$R/units"
  cat >"$R/gpuhost.yaml" <<RYAML
listen: "127.0.0.1:$rport"
state_dir: "$R/state"
gpu: {backend: nvml, release_timeout: 60s}
switch: {ready_timeout: 10m, stop_timeout: 90s, restore_on_boot: false}
backends:
  vllm: {unit: gpuhost-smoke-vllm.service, exec: ["$vllm_bin"], user: $buser}
  ollama: {unit: gpuhost-smoke-ollama.service, exec: ["$ollama_bin"], user: $buser}
profiles:
  small-vllm:
    backend: vllm
    model: $model
    port: 18100
    standby: sleep1
    vllm: {gpu_memory_utilization: 0.5, max_model_len: 4096, max_num_seqs: 16}
  small-ollama:
    backend: ollama
    model: $omodel
    port: 18434
    standby: unload
RYAML
  "$BIN" units render --config "$R/gpuhost.yaml" --binary "$BIN" --dir "$R/units" >/dev/null || { echo "units render failed"; return 1; }
  local f n
  for f in "$R"/units/gpuhost-smoke-*; do
    n=$(basename "$f"); cp "$f" "/run/systemd/system/$n"; REAL_UNITS+=("$n")
  done
  systemctl daemon-reload
  echo "--- the rendered vLLM unit's fence and offline settings:"
  grep -E '^(User|PrivateNetwork|Environment|ExecStart)=' "$R/units/gpuhost-smoke-vllm.service"
  local socks=(); for n in "${REAL_UNITS[@]}"; do case $n in *.socket) socks+=("$n");; esac; done
  systemctl start "${socks[@]}" || { echo "could not start ${socks[*]}"; return 1; }
  echo "--- doctor, local, before any start (profile.model_cache names the fetch command on a miss):"
  "$BIN" --config "$R/gpuhost.yaml" doctor --profile small-vllm | grep -E 'model_cache|fix:|units\.|gpu\.'
  if ! "$BIN" --config "$R/gpuhost.yaml" doctor --profile small-vllm --json | python3 -c '
import json,sys
c=[c for c in json.load(sys.stdin)["checks"] if c["id"]=="profile.model_cache"][0]
if c["severity"]!="ok": print("skipped:", c["severity"], c["message"], "| fix:", c.get("fix","")); sys.exit(1)'; then
    return 0
  fi
  "$BIN" --config "$R/gpuhost.yaml" serve >"$R/serve.log" 2>&1 &
  RPID=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$rport/api/status" >/dev/null && break; sleep 0.1; done
  local p t0 t1
  for p in small-vllm small-ollama small-vllm; do
    echo "--- switch $p (events with their durations):"
    t0=$(date +%s%N)
    "$BIN" --config "$R/gpuhost.yaml" switch "$p"; echo "exit=$?"
    t1=$(date +%s%N); echo "switch $p took $(( (t1-t0)/1000000 )) ms (wall, CLI included)"
    curl -s -m 120 "http://127.0.0.1:$rport/v1/chat/completions" -H 'Content-Type: application/json' \
      -d "{\"model\": \"$([ "$p" = small-vllm ] && echo "$model" || echo "$omodel")\", \"max_tokens\": 16, \"messages\": [{\"role\": \"user\", \"content\": \"Say hi.\"}]}" | head -c 400; echo
  done
  echo "--- nvidia-smi (vLLM serving, Ollama unloaded):"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  echo "--- doctor through the daemon (wake check: standby.wake_verify, standby.*, units.network, endpoint.*):"
  "$BIN" --config "$R/gpuhost.yaml" doctor; echo "exit=$?"
  echo "--- the vLLM unit's journal (tail):"; journalctl -u gpuhost-smoke-vllm.service -n 15 --no-pager
  kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null; RPID=
}
real_fenced_vllm
