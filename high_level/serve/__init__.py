"""Serving layer: a read-only REST API and a results page over the high-level job's Parquet results.

:mod:`api` (FastAPI app, ``lowwater-api``), :mod:`reader` (DuckDB over the results store, with a
per-file statistics index so requests only open the files that can hold the asked windows),
:mod:`params` (parsing and validating user parameters), :mod:`status` (``_status.json`` normalised),
:mod:`metrics` (Prometheus metrics of the API itself), ``static/`` (the page, no build step).
"""
