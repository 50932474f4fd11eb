#!/usr/bin/env bash
# Remove gpuhost's units, drop-ins and binary. Keeps /etc/gpuhost (your
# config), /var/lib/gpuhost (state) and the backend user gpuhost-backend with
# its home /var/lib/gpuhost-backend (the downloaded models); the backends are
# stopped. --purge-backend-user also removes that user and its home.
# Usage: sudo scripts/uninstall.sh [--purge-backend-user]
set -euo pipefail
purge=no
for a in "$@"; do
  case "$a" in
    --purge-backend-user) purge=yes ;;
    *) echo "uninstall.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then echo "uninstall.sh: run as root (sudo)" >&2; exit 1; fi
# gpuhost first, so it does not react to its backends going away; then every
# unit `gpuhost units install` wrote (both backends, and the socket relays
# and their sockets, whose names carry the port).
systemctl disable --now gpuhost.service 2>/dev/null || true
written=$(grep -l 'written by .*gpuhost units' /etc/systemd/system/gpuhost*.service /etc/systemd/system/gpuhost*.socket 2>/dev/null || true)
for f in $written; do
  u=${f##*/}
  [ "$u" = gpuhost.service ] && continue
  systemctl stop "$u" 2>/dev/null || true
done
for f in $written; do rm -f "$f"; done
rm -f /etc/systemd/system/gpuhost.service
for d in /etc/systemd/system/*.service.d/10-gpuhost.conf; do
  [ -e "$d" ] && rm -f "$d"
done
systemctl daemon-reload
rm -f /usr/local/bin/gpuhost
if [ "$purge" = yes ] && getent passwd gpuhost-backend >/dev/null; then
  userdel gpuhost-backend
  rm -rf /var/lib/gpuhost-backend
  echo "gpuhost removed, with the backend user gpuhost-backend and /var/lib/gpuhost-backend; /etc/gpuhost and /var/lib/gpuhost kept"
else
  echo "gpuhost removed; /etc/gpuhost, /var/lib/gpuhost and the backend user gpuhost-backend (home /var/lib/gpuhost-backend: model caches) kept"
fi
