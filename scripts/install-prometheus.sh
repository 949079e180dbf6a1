#!/usr/bin/env bash
# Installs the pinned Prometheus server the tests and `slipstream cluster up` run:
# Debian bookworm's package `prometheus`, version 2.42.0+ds-5+deb12u1, through apt-get.
#
#   bash scripts/install-prometheus.sh     # install, or print "cached" when it is there
#
# The tests start their own server (slipstream.localkube.prometheus) on a free loopback
# port with their own config and data directory; the package's system service is never
# wanted. Debian's postinst tries to start it, so the install runs under a policy-rc.d that
# refuses every service start, and afterwards any prometheus service left running is
# stopped, so nothing keeps listening on :9090.
#
# Env: PROMETHEUS_VERSION (default: the pin below; changing it is a deliberate bump).
set -euo pipefail

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-2.42.0+ds-5+deb12u1}"
BIN=/usr/bin/prometheus
POLICY=/usr/sbin/policy-rc.d

SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO=sudo
fi

installed_version() {
  dpkg-query -W -f='${Version}' prometheus 2>/dev/null || true
}

stop_package_service() {
  # The package's own service only: started by its postinst, not by anyone else here.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl stop prometheus.service >/dev/null 2>&1 || true
    $SUDO systemctl disable prometheus.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    $SUDO /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
  # A daemon started through start-stop-daemon leaves its pidfile behind.
  local pidfile=/run/prometheus/prometheus.pid
  if [ -f "$pidfile" ]; then
    local pid
    pid="$(cat "$pidfile")"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      $SUDO kill "$pid" || true
    fi
  fi
}

if [ "$(installed_version)" = "$PROMETHEUS_VERSION" ] && [ -x "$BIN" ]; then
  echo "cached: prometheus $PROMETHEUS_VERSION ($BIN)"
  exit 0
fi

echo "==> installing prometheus=$PROMETHEUS_VERSION (Debian package, apt-get)"
# Refuse service starts during the install (exit 101 = "action forbidden", see
# invoke-rc.d(8)); put back whatever policy was there before.
backup=""
if [ -e "$POLICY" ]; then
  backup="$(mktemp)"
  $SUDO cp -p "$POLICY" "$backup"
fi
restore_policy() {
  if [ -n "$backup" ]; then
    $SUDO cp -p "$backup" "$POLICY"
    rm -f "$backup"
  else
    $SUDO rm -f "$POLICY"
  fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
$SUDO chmod 0755 "$POLICY"

install() {
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "prometheus=$PROMETHEUS_VERSION"
}
if ! install; then
  # A stale package index (fresh container): refresh once and retry.
  $SUDO apt-get update -q
  install
fi
stop_package_service

got="$(installed_version)"
if [ "$got" != "$PROMETHEUS_VERSION" ]; then
  echo "error: prometheus $got installed, wanted $PROMETHEUS_VERSION" >&2
  exit 1
fi
"$BIN" --version 2>&1 | head -1
echo "installed: prometheus $PROMETHEUS_VERSION ($BIN)"
