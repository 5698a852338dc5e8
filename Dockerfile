# syntax=docker/dockerfile:1
#
# lowwater: ONE image for every role of the project
#   lowwater-agent   capture host (low level)            metrics :9101
#   lowwater-job     high-level Spark job (driver)       metrics :9102 (compose passes --metrics-port)
#   spark-class ...  Spark standalone master / worker    UI :8080 / :8081
#   lowwater-api     REST API + results page             :8080 (/metrics on the API itself)
# Kafka is NOT in this image: compose runs the official apache/kafka image.
#
# Build (from the repository root):   docker build -t lowwater:0.1.0 .
# Nothing in this file has been built under a Docker engine by its author (see deploy/README.md).

# Pinned to an exact Python patch release and Debian release (bookworm ships openjdk-17).
# For fully reproducible builds, also pin the digest: python:3.11.13-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --------------------------------------------------------------------------------------------------
# build stage: Python dependencies (pinned), the project, and the Spark Kafka connector jars (Maven)
# --------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH \
    LOWWATER_STATE_DIR=/var/lib/lowwater

# Java + Maven only to fetch the connector jars (Maven is not copied into the runtime image).
# /usr/share/man/man1 must exist for the openjdk postinst on slim images.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless maven \
 && rm -rf /var/lib/apt/lists/*

# Every runtime dependency pinned (deploy/requirements.lock; tests/test_deploy.py checks it against
# pyproject.toml). Kept before the source COPY so code changes do not reinstall them.
RUN python -m venv /opt/venv
COPY deploy/requirements.lock /tmp/requirements.lock
RUN pip install -r /tmp/requirements.lock

# The Spark Kafka source jars, exactly as ./lw fetches them: local_stack.jars runs
# `mvn dependency:copy-dependencies` on local_stack/maven/spark-kafka.pom.xml and leaves out what
# pyspark already ships. Only local_stack/ is copied first, so a code change elsewhere does not
# re-run Maven. (spark_kafka_jars() is the Spark half of `python -m local_stack.jars`; the Kafka
# broker half is not needed because Kafka runs from the apache/kafka image.)
WORKDIR /app
COPY local_stack ./local_stack
RUN PYTHONPATH=/app python -c "from local_stack.jars import spark_kafka_jars; print(*spark_kafka_jars(), sep='\n')" \
 && test -s "$LOWWATER_STATE_DIR/jars/spark-kafka/jars.txt"

# The project itself, installed editable from /app: the Maven poms in local_stack/maven (which the
# jar stamp check reads at run time) and configs/ are not part of the wheel.
COPY . /app
RUN pip install --no-deps --no-build-isolation -e /app \
 && python -c "import contract, low_level, high_level, local_stack" \
 && rm -rf /app/build

# --------------------------------------------------------------------------------------------------
# runtime stage
# --------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="lowwater" \
      org.opencontainers.image.description="Two-level out-of-order network traffic monitor: capture agent, PySpark job, REST API" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="python:3.11.13-slim-bookworm" \
      io.lowwater.roles="agent,job,spark-master,spark-worker,api" \
      io.lowwater.ports="9101/agent-metrics,9102/job-metrics,8080/api,7077/spark-master"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    LOWWATER_STATE_DIR=/var/lib/lowwater \
    LOWWATER_JIT_CACHE=/tmp/lowwater-jit \
    LOWWATER_HEALTH_URL=http://127.0.0.1:9101/metrics

# openjdk-17: Spark 4.x (driver, master, workers, executors). procps: `ps`, used by Spark's scripts.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 lowwater \
 && useradd --system --uid 10001 --gid lowwater --home-dir /var/lib/lowwater --no-create-home \
      --shell /usr/sbin/nologin lowwater

COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY --from=build --chown=lowwater:lowwater /var/lib/lowwater /var/lib/lowwater

# Writable state of the non-root user (named volumes mounted here inherit this ownership).
# /etc/lowwater/queries.yaml is the default config; compose mounts the real one over it.
RUN install -d -o lowwater -g lowwater \
      /var/lib/lowwater/results /var/lib/lowwater/checkpoint /var/lib/lowwater/spark \
      /var/lib/lowwater/spark-worker /var/lib/lowwater/spark-local \
 && install -d /etc/lowwater \
 && cp /app/configs/default.yaml /etc/lowwater/queries.yaml \
 && java -version 2>&1 | head -n 1 \
 && lowwater-agent --help >/dev/null && lowwater-job --help >/dev/null

WORKDIR /app
# Non-root by default. Only live capture (AF_PACKET) needs uid 0 + CAP_NET_RAW/CAP_NET_ADMIN, and the
# capture-host compose file grants exactly that to the agent container (deploy/capture-host/).
USER lowwater:lowwater

EXPOSE 9101 9102 8080

# Generic check: GET $LOWWATER_HEALTH_URL (default: the agent's /metrics); compose sets the URL per
# role (job :9102/metrics, API :8080/metrics, Spark UIs) or overrides the check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "/app/deploy/docker/healthcheck.py"]

CMD ["lowwater-agent", "--help"]
