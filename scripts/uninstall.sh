#!/usr/bin/env bash
# Remove gpuhost's units, drop-ins and binary. Keeps /etc/gpuhost (your
# config) and /var/lib/gpuhost (state); the backends are stopped.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then echo "uninstall.sh: run as root (sudo)" >&2; exit 1; fi
systemctl disable --now gpuhost.service 2>/dev/null || true
for u in gpuhost-vllm.service gpuhost-ollama.service; do
  systemctl stop "$u" 2>/dev/null || true
  rm -f "/etc/systemd/system/$u"
done
rm -f /etc/systemd/system/gpuhost.service
for d in /etc/systemd/system/*.service.d/10-gpuhost.conf; do
  [ -e "$d" ] && rm -f "$d"
done
systemctl daemon-reload
rm -f /usr/local/bin/gpuhost
echo "gpuhost removed; /etc/gpuhost and /var/lib/gpuhost kept"
