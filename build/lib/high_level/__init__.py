"""High level of lowwater: roll partial aggregates up out of order and close windows by punctuation.

Pure modules (no Spark): :mod:`codec` (state bytes), :mod:`meld` (host marks, liveness, low-water
mark), :mod:`rollup` (merge partials, assemble windows, close), :mod:`partition` (one Kafka
partition's processor), :mod:`store` (Parquet results + status). Spark wiring: :mod:`ingest`,
:mod:`job`; baseline: :mod:`watermark`.
"""
