#!/usr/bin/env bash
# Idempotent set-up for `make test` and `make demo` on a fresh Debian machine:
# system packages, the repo-local .venv with the project installed editable (torch 2.13.0 CPU),
# and the shim. Each step is skipped when already done, so re-running costs a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."

# slurm-wlm + munge: the remediator's Slurm adapter is tested against a real one-machine Slurm;
# chromium: the remediator's status page is tested in a headless browser; docker-compose (v1, parses
# only: no daemon here) checks docker-compose.yml.
APT_PKGS=(prometheus prometheus-alertmanager redis-server iproute2 build-essential slurm-wlm munge chromium docker-compose)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "bootstrap: installing apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's packages may start their own daemons; our tests start private ones on free ports.

PY=${PYTHON:-python3}
stamp=.venv/.failslow-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing the project into .venv (torch 2.13.0 CPU)"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q "torch==2.13.0"
  .venv/bin/pip install -q -e ".[testbed,dev]"
  echo "$want" > "$stamp"
fi

if [ -f shim/Makefile ]; then
  make -s -C shim
fi
echo "bootstrap: ready"
