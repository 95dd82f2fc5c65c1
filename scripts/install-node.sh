#!/usr/bin/env bash
# Install the TypeScript SDK's locked npm dependencies (sdk/typescript/package-lock.json) and build it.
#   scripts/install-node.sh
# Needs Node 20+ and npm on PATH (it installs neither: Debian 12's own nodejs is 18).
# On failure it prints one line naming what failed and the command that fixes it
# (npm's full output is kept in a log file), and exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
sdk=sdk/typescript
fail() { echo "install: $*" >&2; exit 1; }
fix_node="install Node.js 20 or newer with npm (e.g. NodeSource: 'curl -fsSL https://deb.nodesource.com/setup_20.x | sudo bash - && sudo apt-get install -y nodejs'), then 'make test' again"

command -v node >/dev/null || fail "'node' not found (the TypeScript SDK in $sdk needs Node 20+); fix: $fix_node"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[[ "$major" =~ ^[0-9]+$ && "$major" -ge 20 ]] || fail "node $(node -v 2>/dev/null) is too old (the TypeScript SDK needs 20+); fix: $fix_node"
command -v npm >/dev/null || fail "'npm' not found next to node $(node -v); fix: $fix_node"

log=$(mktemp /tmp/brisvox-npm.XXXXXX.log)
echo "install: the TypeScript SDK's npm packages and its build (npm ci; about 10-60 s, log: $log)"
t0=$SECONDS
if ! (cd "$sdk" && npm ci --no-audit --no-fund --loglevel=error) >"$log" 2>&1; then
  what=$(grep -m1 -E 'npm (ERR|error)' "$log" | sed -E 's/^npm (ERR!|error) *//')
  fail "'npm ci' in $sdk failed (${what:-see the log}; log: $log); fix: check the network or the npm registry setting ('npm config get registry'), then 'make test' again"
fi
if ! (cd "$sdk" && npm run --silent build) >"$log" 2>&1; then
  fail "building the TypeScript SDK failed ($(grep -m1 -E 'error TS[0-9]+' "$log" || tail -1 "$log"); log: $log); fix: 'cd $sdk && npm run build' shows every error"
fi
rm -f "$log"
echo "install: TypeScript SDK done ($((SECONDS - t0)) s)"
