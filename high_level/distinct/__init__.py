"""Duplicate elimination (``kind: distinct``) in the job: the operator and its stream."""
