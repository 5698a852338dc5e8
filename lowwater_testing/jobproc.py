"""The high-level job in a process of its own, for tests that SIGKILL it (tests/test_exactly_once.py).

``python -m lowwater_testing.jobproc <job.json>``: the JSON holds ``queries`` (QuerySpec documents) and
``options`` (:class:`high_level.options.JobOptions` fields). The job runs until every topic's current
end is processed, then stops and exits 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from contract import query as Q
from high_level.job import HighLevelJob, JobOptions


def write_spec(path: Path, queries: list[Q.QuerySpec], **options: object) -> Path:
    """The document :func:`main` reads."""
    doc = {"queries": [q.model_dump(mode="json") for q in queries], "options": options}
    path.write_text(json.dumps(doc))
    return path


def main(argv: list[str] | None = None) -> int:
    from local_stack.spark_session import build_spark

    doc = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    queries = [Q.QuerySpec.model_validate(q) for q in doc["queries"]]
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
