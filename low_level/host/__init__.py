"""The capture host: its loop, punctuation, backlog, Kafka output, on-request marks and metrics."""
