#!/usr/bin/env bash
# Switches under probes: `gpuhost bench switch A B --rounds N` against a demo
# while `gpuhost doctor --json` runs and /metrics is scraped every 0.5 s, then
# p50/p95 per direction and mode, the switches over 2 s, and the doctor's
# exit statuses. Usage: scripts/standby-under-probes.sh [BIN] [ROUNDS]
# (defaults ./bin/gpuhost, 50). Needs curl and python3; no root, no GPU.
set -u
bin=${1:-./bin/gpuhost}; rounds=${2:-50}
state=$(mktemp -d); port=$((20000 + RANDOM % 20000))
export GPUHOST_URL=http://127.0.0.1:$port
"$bin" demo --listen "127.0.0.1:$port" --state-dir "$state" >"$state/demo.log" 2>&1 &
demo=$!
poll=
trap 'kill $demo $poll 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 120); do
  curl -sf "$GPUHOST_URL/api/status" | grep -q '"phase":"active"' && break
  sleep 1
done
(while :; do
  "$bin" doctor --json >/dev/null 2>&1; echo "doctor rc=$?" >>"$state/doctor.rc"
  curl -sf "$GPUHOST_URL/metrics" >/dev/null && echo ok >>"$state/metrics.ok"
  sleep 0.5
done) &
poll=$!
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" bench switch qwen3-coder llama3-8b --rounds "$rounds" --json >"$state/switch.json"
echo "bench switch exit status $?; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$state/switch.json" <<'PY'
import json, math, statistics, sys
r = json.load(open(sys.argv[1]))["switch"]
groups = {}
for s in r["samples"]:
    groups.setdefault((s["from"], s["to"], s["mode"]), []).append(s)
def p95(v):
    v = sorted(v); return v[max(0, math.ceil(0.95 * len(v)) - 1)]
for (a, b, mode), ss in sorted(groups.items()):
    ft = [s["first_token_ms"] for s in ss]; sw = [s["switch_ms"] for s in ss]
    print(f"{a} -> {b} {mode}: n={len(ss)} first token p50 {statistics.median(ft):.0f} p95 {p95(ft):.0f} ms "
          f"(p95/p50 {p95(ft)/statistics.median(ft):.2f}); switch p50 {statistics.median(sw):.0f} "
          f"p95 {p95(sw):.0f} max {max(sw):.0f} ms; over 2 s: {sum(x > 2000 for x in sw)}")
print("outliers:", len(r.get("outliers") or []))
PY
echo "doctor runs: $(sort "$state/doctor.rc" | uniq -c | tr '\n' ' '); /metrics scrapes: $(wc -l <"$state/metrics.ok")"
echo "state: $state"
