"""Aggregate queries: the Kafka source, per-partition processors, roll-up state and its Spark steps."""
