#!/usr/bin/env bash
# Install gpuhost on a systemd box: binary, example config (only if none),
# units (or drop-ins with --adopt), daemon-reload, enable --now gpuhost.
# Usage: sudo scripts/install.sh [path/to/gpuhost] [--adopt]
set -euo pipefail
bin="bin/gpuhost"
adopt=()
for a in "$@"; do
  case "$a" in
    --adopt) adopt=(--adopt) ;;
    *) bin="$a" ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then echo "install.sh: run as root (sudo)" >&2; exit 1; fi
if [ ! -x "$bin" ]; then
  echo "install.sh: $bin not found; building it with cgo (make build-gpu; needs gcc)" >&2
  make build-gpu
  bin="bin/gpuhost"
fi
# `make build` / `make demo` leave a binary without cgo, which cannot read a
# real GPU (the NVML stub answers "built without cgo"): refuse it.
if grep -qa 'gpuhost was built without cgo' "$bin"; then
  echo "install.sh: $bin was built without cgo (make build / make demo) and cannot use the NVIDIA driver; build it with: make build-gpu" >&2
  exit 1
fi
install -D -m 0755 "$bin" /usr/local/bin/gpuhost.new
mv -f /usr/local/bin/gpuhost.new /usr/local/bin/gpuhost   # atomic replace of a running binary
install -d -m 0750 /etc/gpuhost /var/lib/gpuhost
# The backends (vLLM, Ollama) run as this unprivileged system user; its home
# holds the model caches (~/.cache/huggingface, ~/.ollama) and is the
# backend units' ReadWritePaths=. Must match units.DefaultBackendUser.
backend_user=gpuhost-backend
backend_home=/var/lib/gpuhost-backend
if ! getent passwd "$backend_user" >/dev/null; then
  useradd --system --user-group --home-dir "$backend_home" --shell /usr/sbin/nologin \
    --comment "gpuhost inference backends" "$backend_user"
fi
install -d -m 0750 -o "$backend_user" -g "$backend_user" "$backend_home"
# Where /dev/nvidia* is not world-accessible, the driver grants it to "video".
if getent group video >/dev/null; then usermod -a -G video "$backend_user"; fi
/usr/local/bin/gpuhost units install --config /etc/gpuhost/gpuhost.yaml --binary /usr/local/bin/gpuhost "${adopt[@]}"
/usr/local/bin/gpuhost doctor --config /etc/gpuhost/gpuhost.yaml || true
