#!/usr/bin/env bash
# Install the Debian packages of scripts/apt-packages.txt that are missing.
#   scripts/install-apt.sh [run|test]    (default run; test = run + test)
# Idempotent; needs root (or sudo) only when something is missing. On failure it
# prints one line naming the package and the command that fixes it, and exits 1.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
profile=${1:-run}
case "$profile" in run|test) ;; *) echo "install-apt: unknown profile '$profile' (run or test)" >&2; exit 2;; esac
missing=()
while read -r pkg tag _; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  tag=${tag:-run}
  [[ "$tag" == test && "$profile" != test ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < "${BRISVOX_APT_LIST:-$here/apt-packages.txt}"
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "install: missing Debian packages ${missing[*]}; fix: as root run 'apt-get install ${missing[*]}', then 'make install' again" >&2
    exit 1
  fi
  SUDO="sudo"
fi
echo "install: Debian packages ${missing[*]} (apt-get; about 1-5 minutes on a fresh machine)"
t0=$SECONDS
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp /tmp/brisvox-apt.XXXXXX.log)
if ! $SUDO apt-get update -q >"$log" 2>&1; then
  echo "install: 'apt-get update' failed ($(grep -E '^(E|W):' "$log" | head -1)); fix: check /etc/apt/sources.list*, then 'make install' again (log: $log)" >&2
  exit 1
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
  bad=$(grep -oE "Unable to locate package [^ ]+|Package '?[^ ']+'? has no installation candidate" "$log" | head -1)
  echo "install: apt-get could not install ${missing[*]}${bad:+ ($bad)}; fix: 'sudo apt-get install ${missing[*]}' shows why, then 'make install' again (log: $log)" >&2
  exit 1
fi
rm -f "$log"
echo "install: Debian packages done ($((SECONDS - t0)) s)"
# Debian starts kamailio at install with its stock config, on port 5060 of every address:
# the port `make run`'s brisvoxd listens on. The fleet test runs its own kamailio, so a
# kamailio this script just installed is stopped and disabled.
if [[ " ${missing[*]} " == *" kamailio "* ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  if $SUDO systemctl disable --now kamailio >/dev/null 2>&1; then
    echo "install: stopped and disabled the stock kamailio service (it holds port 5060; the tests run their own)"
  fi
fi
exit 0
