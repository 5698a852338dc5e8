"""The high-level job in a process of its own, for tests that SIGKILL it (tests/test_exactly_once.py).

``python -m lowwater_testing.jobproc <job.pickle>``: the test's validated queries and the
:class:`high_level.options.JobOptions` fields, pickled (a QuerySpec's dump is not its config text, and
this is the test's own file). The job runs until every topic's current end is processed, then stops
and exits 0.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from contract import query as Q
from high_level.job import HighLevelJob, JobOptions


def write_spec(path: Path, queries: list[Q.QuerySpec], **options: object) -> Path:
    """The document :func:`main` reads."""
    path.write_bytes(pickle.dumps({"queries": list(queries), "options": options}))
    return path


def main(argv: list[str] | None = None) -> int:
    from local_stack.spark_session import build_spark

    doc = pickle.loads(Path((argv or sys.argv[1:])[0]).read_bytes())  # noqa: S301 - the test wrote it
    queries = doc["queries"]
    opts = JobOptions(**doc["options"])
    spark = build_spark(opts.name, "local[2]", state=Path(opts.checkpoint).parent / "spark-state")
    job = HighLevelJob(spark, queries, opts)
    job.start()
    try:
        job.process_all_available()
    finally:
        job.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
