"""Closed windows leaving the job: the store, the sink, alerts and the Prometheus export."""
