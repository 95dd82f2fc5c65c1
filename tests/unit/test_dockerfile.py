"""The container image's Dockerfile, checked without a container builder.

No Docker daemon, buildah or podman runs on the CI machine, so the image is not built in CI
(docs/OPERATIONS.md, "In a container"). What can be checked here is: the instructions say what
the image promises (Debian 12 slim, a non-root user, the models installed at build, the health
check on /healthz, the stop signal the supervisor drains on), every file it copies exists, the
Debian packages it installs are exactly the ``run`` profile of scripts/apt-packages.txt (the
awk filter is run here on the real list), and the config it starts with passes
``brisvoxd check`` with its secrets given and names them when they are not.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONFIG = ROOT / "configs" / "brisvoxd.container.toml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "a continuation line ends the file"
    return out


def test_the_image_is_debian_12_slim_non_root_with_a_health_check_and_a_draining_stop():
    ins = instructions()
    words = [w for w, _ in ins]
    assert ins[0] == ("FROM", "debian:12-slim")
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN"), "no RUN as the final user"
    health = " ".join(a for w, a in ins if w == "HEALTHCHECK")
    assert "/healthz" in health and "--start-period" in health
    assert ("STOPSIGNAL", "SIGTERM") in ins  # SIGTERM = drain, then stop (docs/OPERATIONS.md)
    entry = next(a for w, a in ins if w == "ENTRYPOINT")
    assert "brisvoxd" in entry and "--foreground" in entry
    runs = " ".join(a for w, a in ins if w == "RUN")
    assert "brisvox models install" in runs, "the models are installed at build, not at first start"
    assert "-c constraints.txt" in runs, "the image installs the pinned versions"


def test_every_copied_path_exists():
    for w, a in instructions():
        if w == "COPY":
            *srcs, _dst = shlex.split(a)
            for s in srcs:
                assert (ROOT / s).exists(), f"COPY {s}: no such path"


def test_the_image_installs_the_run_profile_of_the_package_list():
    ins = instructions()
    run = next(a for w, a in ins if w == "RUN" and "awk" in a)
    awk = re.search(r"awk '([^']+)'", run)
    assert awk is not None
    got = subprocess.run(["awk", awk.group(1), str(ROOT / "scripts" / "apt-packages.txt")],
                         capture_output=True, text=True, check=True).stdout.split()
    want = []
    for line in (ROOT / "scripts" / "apt-packages.txt").read_text().splitlines():
        parts = line.split()
        if parts and not parts[0].startswith("#") and (len(parts) == 1 or parts[1] == "run"):
            want.append(parts[0])
    assert got == want and "python3-venv" in got and "sip-tester" not in got


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("BRISVOX_NATIVE_SECRET", "TWILIO_AUTH_TOKEN")}
    return subprocess.run([sys.executable, "-m", "brisvox.cli.brisvoxd", "check", str(CONFIG)],
                          capture_output=True, text=True, env={**base, **env}, timeout=60)


def test_the_container_config_passes_the_check_and_names_its_secrets():
    ok = _check({"BRISVOX_NATIVE_SECRET": "s" * 32, "TWILIO_AUTH_TOKEN": "t" * 32})
    assert ok.returncode == 0, ok.stderr + ok.stdout
    missing = _check({})
    out = missing.stdout + missing.stderr
    assert "BRISVOX_NATIVE_SECRET" in out and "TWILIO_AUTH_TOKEN" in out
