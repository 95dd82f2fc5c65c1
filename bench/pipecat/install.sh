#!/usr/bin/env bash
# Create bench/.venv-pipecat with pinned Pipecat (idempotent: a venv whose
# requirements stamp matches requirements.txt is left as it is).
# Usage: bench/pipecat/install.sh [python]   (default python3; needs 3.10+)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/../.venv-pipecat"
req="$here/requirements.txt"
py="${1:-python3}"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "bench/.venv-pipecat is up to date"
    exit 0
fi
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q -r "$req"
# torch must never be in this venv (it would change memory figures and take GBs).
if "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
    echo "error: torch got installed into bench/.venv-pipecat" >&2
    exit 1
fi
"$venv/bin/python" -c "import pipecat, fastapi, uvicorn; from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3; from pipecat.audio.vad.silero import SileroVADAnalyzer"
echo "$want" > "$stamp"
echo "bench/.venv-pipecat ready ($("$venv/bin/python" -c 'import importlib.metadata as m; print("pipecat-ai", m.version("pipecat-ai"))'))"
