"""Serving layer: a read-only REST API and a results page over the high-level job's Parquet results.

:mod:`api` (FastAPI app, ``lowwater-api``), :mod:`reader` (the requests, DuckDB over the results
store), :mod:`fileindex` (which files a request reads: footer statistics per file, files that break
the :mod:`contract.results` layout rejected), :mod:`tablecache` (decoded files prepared for top-N, LRU),
:mod:`sql` (the SQL text: filters, folding corrections, ranking), :mod:`columns` (a query's result
columns), :mod:`timefmt` (epoch microseconds and ISO text), :mod:`params` (parsing and validating user
parameters), :mod:`status` (``_status.json`` normalised), :mod:`incomplete` (flagged short windows,
rows or not), :mod:`metrics` (Prometheus metrics of the API itself), ``static/`` (the page, no build step).
"""
