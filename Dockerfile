# brisvoxd in a container: Debian 12 slim, the local models installed at build, a non-root
# user, the health check on /healthz. Build and run (docs/OPERATIONS.md, "In a container"):
#   docker build -t brisvox .
#   docker run --rm -e BRISVOX_NATIVE_SECRET=$(openssl rand -hex 32) -e TWILIO_AUTH_TOKEN=... \
#     -e BRISVOX_SIP_ALLOW="203.0.113.0/24" --ulimit nofile=65536:65536 \
#     -p 8765:8765 -p 5060:5060/udp -p 20000-20200:20000-20200/udp --shm-size=256m brisvox
# SIP answers only the networks of BRISVOX_SIP_ALLOW (your carrier's or SBC's, comma-separated);
# unset, only the container's loopback: SIP answers no one outside. An allow list that admits the
# whole Internet (0.0.0.0/0) stops the daemon with exit code 2 (no SIP authentication exists).
# The audio rings live in /dev/shm: give the container room (--shm-size; ~1 MB per call).
FROM debian:12-slim

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    BRISVOX_MODELS_DIR=/opt/brisvox/models

# The Debian packages of `make run` (scripts/apt-packages.txt, profile run) and curl for the
# health check; the build toolchain is needed by llama-cpp-python's source build.
COPY scripts/apt-packages.txt /tmp/apt-packages.txt
RUN apt-get update \
 && awk '!/^#/ && NF && ($2 == "" || $2 == "run") {print $1}' /tmp/apt-packages.txt \
      | xargs apt-get install -y -q --no-install-recommends curl \
 && rm -rf /var/lib/apt/lists/* /tmp/apt-packages.txt

RUN useradd --system --user-group --home-dir /var/lib/brisvox --create-home \
      --shell /usr/sbin/nologin brisvox \
 && install -d -o brisvox -g brisvox -m 0700 /run/brisvox /var/lib/brisvox

WORKDIR /opt/brisvox
# dependencies first (a layer that survives source edits), then the source
COPY pyproject.toml constraints.txt README.md ./
COPY ipc ipc
COPY brisvox brisvox
COPY workers workers
COPY configs configs
RUN python3 -m venv .venv \
 && .venv/bin/pip install --no-cache-dir -q --disable-pip-version-check -c constraints.txt ".[local]" \
 && .venv/bin/brisvox models install \
 && chmod -R a+rX /opt/brisvox

USER brisvox
# SIP (UDP), RTP (the container config's range), WebSocket media and /healthz
EXPOSE 5060/udp 20000-20200/udp 8765
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD curl -fsS http://127.0.0.1:9464/healthz >/dev/null || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/brisvox/.venv/bin/brisvoxd", "start", "--foreground"]
CMD ["--config", "/opt/brisvox/configs/brisvoxd.container.toml"]
