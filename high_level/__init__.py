"""High level of lowwater: roll partial aggregates up out of order and close windows by punctuation.

Wings: :mod:`aggregate` (ingest, per-partition processor, roll-up state, its Spark steps, the watermark
baseline), :mod:`join`, :mod:`results` (store, sink, alerts, export), :mod:`live`, :mod:`serve`,
:mod:`cluster` (session, placement, partition counts). The job (:mod:`job`) conducts one
:class:`pipeline.Pipeline` per query kind.
"""
