# syntax=docker/dockerfile:1
#
# lowwater: one Dockerfile, one image TARGET per role (a capture host needs no JRE, Spark, DuckDB or
# FastAPI, so the agent image carries none of them):
#   --target agent     lowwater-agent   capture host (low level)             metrics :9101
#   --target central   lowwater-job     high-level Spark job (driver)        metrics :9102
#                      spark-class ...  Spark standalone master / worker     UI :8080 / :8081
#                      lowwater-api     REST API + results page              :8080 (/metrics on the API itself)
#                      create_topics    topic provisioning (kafka-init)
# Kafka is NOT in these images: compose runs the official apache/kafka image (KAFKA_IMAGE).
#
# Build (from the repository root):
#   docker build --target agent   -t lowwater-agent:0.1.0 .
#   docker build --target central -t lowwater-central:0.1.0 .
# (the compose files build the right target for each service). tests/test_compose.py builds both
# targets through the compose files on a real engine in CI (sizes and build times: deploy/README.md).
# Where Docker Hub is unreachable: --build-arg PYTHON_IMAGE=<a local python 3.11 bookworm image>.

# Pinned to an exact Python patch release and Debian release (bookworm ships openjdk-17).
# For fully reproducible builds, also pin the digest: python:3.11.13-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --------------------------------------------------------------------------------------------------
# base: what every role shares (user, environment, an empty venv)
# --------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base

# Extra CA certificates (PEM text, several allowed) for builds behind a TLS-inspecting proxy: added to
# the system bundle before anything is fetched, so pip (PIP_CERT) and Java's truststore (built from
# the system store when the JRE is installed, used by Maven) trust them. Empty: nothing changes.
#   docker build --build-arg EXTRA_CA_CERTS="$(cat my-proxy-ca.pem)" ...   (compose: LOWWATER_EXTRA_CA_CERTS)
ARG EXTRA_CA_CERTS=""
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
      mkdir -p /usr/local/share/ca-certificates/lowwater-extra \
      && printf '%s\n' "$EXTRA_CA_CERTS" | awk '/-----BEGIN CERTIFICATE-----/{n++} n{print > ("/usr/local/share/ca-certificates/lowwater-extra/" n ".crt")}' \
      && update-ca-certificates >/dev/null; \
    fi

ENV PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    LOWWATER_STATE_DIR=/var/lib/lowwater \
    LOWWATER_JIT_CACHE=/tmp/lowwater-jit

RUN groupadd --system --gid 10001 lowwater \
 && useradd --system --uid 10001 --gid lowwater --home-dir /var/lib/lowwater --no-create-home \
      --shell /usr/sbin/nologin lowwater \
 && python -m venv /opt/venv \
 && install -d -o lowwater -g lowwater /var/lib/lowwater \
 && install -d /etc/lowwater
WORKDIR /app

# release: base with the labels every role image shares. The build stages start from base, so a new
# VCS_REF (every commit) rebuilds no dependency layer, only the role stages' own (which a commit's code
# change rebuilds anyway).
FROM base AS release
ARG VERSION=0.1.0
ARG VCS_REF=unknown
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="python:3.11.13-slim-bookworm"

# --------------------------------------------------------------------------------------------------
# agent: the capture host. Python dependencies of lowwater[agent] only (deploy/requirements-agent.lock:
# numba, pyarrow, kafka-python, ...), no Java, no Spark, no DuckDB, no FastAPI.
# --------------------------------------------------------------------------------------------------
# The dependencies only: the runtime stage copies this venv, a layer that stays cached while the lock
# does not change; the project itself is installed there, so a code change rebuilds only small layers.
FROM base AS build-agent
COPY deploy/requirements-agent.lock /tmp/requirements.lock
RUN pip install -r /tmp/requirements.lock

FROM release AS agent
LABEL org.opencontainers.image.title="lowwater-agent" \
      org.opencontainers.image.description="lowwater capture agent (low level): AF_PACKET/pcap -> Numba sub-aggregation -> Kafka" \
      io.lowwater.roles="agent" \
      io.lowwater.ports="9101/agent-metrics"
ENV LOWWATER_HEALTH_URL=http://127.0.0.1:9101/metrics
COPY --from=build-agent /opt/venv /opt/venv
COPY . /app
RUN pip install --no-deps --no-build-isolation -e /app \
 && python -c "import contract, low_level.cli" \
 && rm -rf /app/build \
 && cp /app/configs/default.yaml /etc/lowwater/queries.yaml \
 && lowwater-agent --help >/dev/null \
 && ! python -c "import pyspark" 2>/dev/null && ! python -c "import duckdb" 2>/dev/null
# Non-root by default. Only live capture (AF_PACKET) needs uid 0 + CAP_NET_RAW/CAP_NET_ADMIN, and the
# capture-host compose file grants exactly that to the agent container (deploy/capture-host/).
USER lowwater:lowwater
EXPOSE 9101
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "/app/deploy/docker/healthcheck.py"]
CMD ["lowwater-agent", "--help"]

# --------------------------------------------------------------------------------------------------
# central: the Spark job, Spark master/worker, the REST API and topic provisioning. Python
# dependencies of lowwater[central] (deploy/requirements-central.lock), Java 17 and the Spark Kafka
# connector jars (Maven, at build time only).
# --------------------------------------------------------------------------------------------------
FROM base AS build-central

# Java + Maven only to fetch the connector jars (Maven is not copied into the runtime image).
# /usr/share/man/man1 must exist for the openjdk postinst on slim images.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless maven \
 && rm -rf /var/lib/apt/lists/*

# Every runtime dependency pinned (tests/test_deploy.py checks the lock against pyproject.toml).
# Kept before the source COPY so code changes do not reinstall them.
COPY deploy/requirements-central.lock /tmp/requirements.lock
RUN pip install -r /tmp/requirements.lock

# The Spark Kafka source jars, exactly as ./lw fetches them: local_stack.jars runs
# `mvn dependency:copy-dependencies` on local_stack/maven/spark-kafka.pom.xml and leaves out what
# pyspark already ships. Only local_stack/ is copied first, so a code change elsewhere does not
# re-run Maven. (spark_kafka_jars() is the Spark half of `python -m local_stack.jars`; the Kafka
# broker half is not needed because Kafka runs from the apache/kafka image.) The jars the job hands
# Spark move to /var/lib/lowwater/jars/spark-job, which the central image names in
# LOWWATER_JOB_SPARK_JARS: the job itself never imports local_stack.
COPY local_stack ./local_stack
RUN PYTHONPATH=/app python -c "from local_stack.jars import spark_kafka_jars; print(*spark_kafka_jars(), sep='\n')" \
      > /tmp/spark-jars.txt \
 && test -s "$LOWWATER_STATE_DIR/jars/spark-kafka/jars.txt" \
 && install -d /var/lib/lowwater/jars/spark-job \
 && xargs -a /tmp/spark-jars.txt mv -t /var/lib/lowwater/jars/spark-job \
 && rm -rf "$LOWWATER_STATE_DIR/jars/spark-kafka" /tmp/spark-jars.txt \
 && ls /var/lib/lowwater/jars/spark-job/spark-sql-kafka-*.jar

FROM release AS central
LABEL org.opencontainers.image.title="lowwater-central" \
      org.opencontainers.image.description="lowwater central roles: PySpark job, Spark master/worker, REST API" \
      io.lowwater.roles="job,spark-master,spark-worker,api,kafka-init" \
      io.lowwater.ports="9102/job-metrics,8080/api,7077/spark-master"
ENV LOWWATER_HEALTH_URL=http://127.0.0.1:9102/metrics \
    LOWWATER_JOB_SPARK_JARS='["/var/lib/lowwater/jars/spark-job"]'

# openjdk-17: Spark 4.x (driver, master, workers, executors). procps: `ps`, used by Spark's scripts.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

COPY --from=build-central /opt/venv /opt/venv
COPY --from=build-central --chown=lowwater:lowwater /var/lib/lowwater /var/lib/lowwater

# The project itself, installed editable from /app, last (a code change rebuilds only from here): the
# Maven poms in local_stack/maven (which the jar stamp check reads at run time) and configs/ are not
# part of the wheel.
COPY . /app
RUN pip install --no-deps --no-build-isolation -e /app \
 && python -c "import contract, high_level.job, high_level.serve.api, local_stack" \
 && rm -rf /app/build

# Writable state of the non-root user (named volumes mounted here inherit this ownership).
# /etc/lowwater/queries.yaml is the default config; compose mounts the real one over it.
RUN install -d -o lowwater -g lowwater \
      /var/lib/lowwater/results /var/lib/lowwater/checkpoint /var/lib/lowwater/spark \
      /var/lib/lowwater/spark-worker /var/lib/lowwater/spark-local \
 && cp /app/configs/default.yaml /etc/lowwater/queries.yaml \
 && java -version 2>&1 | head -n 1 \
 && lowwater-job --help >/dev/null && lowwater-api --help >/dev/null

USER lowwater:lowwater
EXPOSE 9102 8080 7077
# Generic check: GET $LOWWATER_HEALTH_URL (default: the job's /metrics); compose sets the URL per
# role (API :8080/metrics, Spark UIs) or overrides the check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "/app/deploy/docker/healthcheck.py"]

CMD ["lowwater-job", "--help"]
