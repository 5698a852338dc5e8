"""Entrypoint of the apache/kafka stand-in: KAFKA_* environment -> server.properties, format, run.

The translation is apache/kafka's (docker/jvm/launch + configure): ``KAFKA_FOO_BAR`` becomes
``foo.bar``, ``__`` becomes ``_`` and ``___`` becomes ``-``; JVM variables (``KAFKA_HEAP_OPTS`` and
the like) are left to the JVM; ``CLUSTER_ID`` formats the log dirs on first start.
"""

import os
import subprocess
import sys

JVM_VARS = {
    "KAFKA_HEAP_OPTS",
    "KAFKA_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_DEBUG",
    "KAFKA_VERSION",
}
CONFIG = "/opt/kafka/config/server.properties"
LOG4J = "/opt/kafka/config/log4j2.xml"


def prop_name(var: str) -> str:
    name = var[len("KAFKA_") :].lower()
    return (
        name.replace("___", "\0").replace("__", "\1").replace("_", ".").replace("\0", "-").replace("\1", "_")
    )


def main() -> None:
    props = {
        prop_name(k): v for k, v in sorted(os.environ.items()) if k.startswith("KAFKA_") and k not in JVM_VARS
    }
    with open(CONFIG, "w") as fh:
        fh.writelines(f"{k}={v}\n" for k, v in props.items())
    with open(LOG4J, "w") as fh:
        fh.write(
            '<Configuration status="WARN"><Appenders><Console name="C" target="SYSTEM_OUT">'
            '<PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders><Loggers>'
            '<Logger name="kafka.request.logger" level="WARN"/><Root level="INFO">'
            '<AppenderRef ref="C"/></Root></Loggers></Configuration>\n'
        )
    java = [
        "java",
        *os.environ.get("KAFKA_HEAP_OPTS", "-Xmx1g -Xms1g").split(),
        *os.environ.get("KAFKA_OPTS", "").split(),
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J}",
        "-cp",
        "/opt/kafka/libs/*",
    ]
    cluster_id = os.environ.get("CLUSTER_ID")
    if not cluster_id:
        sys.exit("kafka stand-in: CLUSTER_ID is required (as for apache/kafka)")
    fmt = [
        *java,
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        CONFIG,
        "--ignore-formatted",
    ]
    if "controller.quorum.voters" not in props:
        fmt.append("--standalone")
    subprocess.run(fmt, check=True)
    os.execvp("java", [*java, "kafka.Kafka", CONFIG])


if __name__ == "__main__":
    main()
