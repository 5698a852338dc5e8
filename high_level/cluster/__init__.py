"""Spark plumbing: the session, partition placement, the Python worker launcher, the partition guard."""
