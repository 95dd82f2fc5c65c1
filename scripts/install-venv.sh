#!/usr/bin/env bash
# Create .venv (if needed) and install brisvox with the given extras, pinned by constraints.txt.
#   scripts/install-venv.sh PYTHON EXTRAS      e.g. scripts/install-venv.sh python3 local
# On failure it prints one line naming what failed and the command that fixes it
# (pip's full output is kept in a log file), and exits 1. Never a stack trace.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
extras=${2:-local}
venv=.venv
fail() { echo "install: $*" >&2; exit 1; }

command -v "$py" >/dev/null || fail "'$py' not found; fix: 'sudo apt-get install python3' (3.11 or newer), then 'make install'"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail "$("$py" -V 2>&1) is too old (brisvox needs 3.11+); fix: install python3.11 and run 'make install PYTHON=python3.11'"
if [[ ! -x $venv/bin/python ]]; then
  out=$("$py" -m venv "$venv" 2>&1) || {
    rm -rf "$venv"
    fail "'$py -m venv' failed ($(echo "$out" | grep -m1 -iE 'ensurepip|venv|error' || echo "$out" | tail -1)); fix: 'sudo apt-get install python3-venv', then 'make install'"
  }
fi
log=.venv-install.log
pipi() {  # pip install, quiet; on failure name the distribution that failed
  if ! $venv/bin/python -m pip install --disable-pip-version-check "$@" >"$log" 2>&1; then
    what=$(grep -m1 -oE "Failed (building wheel for|to build) [A-Za-z0-9_.-]+|No matching distribution found for [^ ]+|Could not find a version that satisfies the requirement [^ ]+|failed-wheel-build-for-install.*" "$log")
    pkg=$(echo "$what" | grep -oE '[A-Za-z0-9_.-]+([<>=!~].*)?$' | sed -E 's/[<>=!~].*//')
    case "$pkg" in
      llama[-_]cpp[-_]python) hint="'sudo apt-get install build-essential cmake python3-dev' (its C++ build), then 'make install'";;
      "") hint="read $log, then 'make install'";;
      *) hint="read $log for $pkg's error, then 'make install'";;
    esac
    fail "pip could not install ${what:-the Python packages} (log: $log); fix: $hint"
  fi
}
# a newer pip when the index has one (Debian 12's venv pip is 23.0); an old one still works
$venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
if [[ -f $venv/.brisvox-installed && $venv/.brisvox-installed -nt constraints.txt && $venv/.brisvox-installed -nt pyproject.toml ]]; then
  echo "install: Python packages [$extras] (checking what .venv has; a few seconds)"
else
  echo "install: Python packages [$extras] into .venv (pip; about 2-6 minutes on a fresh machine, log: $log)"
fi
t0=$SECONDS
pipi -q -c constraints.txt -e ".[$extras]"
rm -f "$log"
touch $venv/.brisvox-installed
echo "install: Python packages [$extras] done ($((SECONDS - t0)) s)"
