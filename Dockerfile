# fleetgate: one image for the gateway (the default command) and the engine emulator
# (`fleetgate emulate ...`).
#
#   docker build -t fleetgate .
#   docker run --rm -p 8080:8080 -v "$PWD/my-gateway.yaml:/etc/fleetgate/gateway.yaml:ro" fleetgate
#   docker run --rm -p 8000:8000 -e FLEETGATE_HEALTHCHECK_URL=http://127.0.0.1:8000/health \
#       fleetgate fleetgate emulate --host 0.0.0.0 --port 8000 \
#       --personality vllm --model llama-3.1-8b --max-model-len 8192

ARG PYTHON_VERSION=3.11

# --- builder: install the project and its dependencies into a self-contained venv -----------
FROM python:${PYTHON_VERSION}-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# .dockerignore keeps tests, benchmarks, caches and local venvs out of this copy.
COPY . .
# Every dependency ships manylinux wheels for CPython 3.11 (amd64 and arm64); the only
# compiled code is the project's own compressor/_fast.c, so this stage (not the final image)
# gets gcc. A regular (not editable) install: /src is not in the final image. The import
# check fails the build if the C helper was skipped (setup.py marks it optional); -I, so
# that it imports the installed package, not the source tree in /src. The `kubernetes` extra:
# pools that find their workers from EndpointSlices (`discovery`), as deploy/kubernetes runs it;
# the `otel` extra: `tracing.enabled` (OpenTelemetry over OTLP/HTTP, docs/TRACING.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --upgrade pip \
 && pip install '.[kubernetes,otel]' \
 && fleetgate --version \
 && python -I -c "import compressor._fast"

# --- runtime: the venv and nothing else ------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim

RUN groupadd --system --gid 10001 fleetgate \
 && useradd --system --uid 10001 --gid fleetgate --create-home --home-dir /home/fleetgate \
      --shell /usr/sbin/nologin fleetgate

COPY --from=builder /opt/venv /opt/venv
# The example configuration; mount your own over it (it names workers on 127.0.0.1).
COPY config/gateway.yaml /etc/fleetgate/gateway.yaml

# FLEETGATE_LISTEN__HOST: inside a container the gateway must listen on every interface
# (environment overrides the config file's listen.host; set it back to restrict).
# FLEETGATE_HEALTHCHECK_URL is read by the HEALTHCHECK below only (no double underscore, so
# the gateway's configuration ignores it); an emulator container points it at its /health.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FLEETGATE_LISTEN__HOST=0.0.0.0 \
    FLEETGATE_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz

USER 10001:10001
WORKDIR /home/fleetgate

EXPOSE 8080

# slim has no curl: ask Python. Any answer other than 200 (or no answer) is unhealthy.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(0 if urllib.request.urlopen(os.environ['FLEETGATE_HEALTHCHECK_URL'], timeout=2).status == 200 else 1)"]

CMD ["fleetgate", "serve", "--config", "/etc/fleetgate/gateway.yaml"]
