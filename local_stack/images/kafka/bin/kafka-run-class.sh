#!/bin/sh
# apache/kafka's kafka-run-class.sh, reduced: CLASS ARGS on the broker's classpath (client-side JVM).
exec java -Xmx256m -XX:TieredStopAtLevel=1 -Dlog4j2.level=WARN -cp '/opt/kafka/libs/*' "$@"
