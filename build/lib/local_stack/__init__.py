"""Local stand-ins for the services lowwater talks to in production.

A single-node Kafka broker (KRaft) and a local-mode Spark session, both built from jars that
Maven fetches into ``<repo>/.state``, so that tests and ``./lw run`` exercise the real wire
protocol and the real Spark Kafka source instead of mocks.
"""
