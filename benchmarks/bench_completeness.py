"""Completeness under injected faults: per cause, windows wrong, flagged, and wrong yet complete.

Each fault is injected for real (the scenarios of ``lowwater_testing/faults.py``, shared with
``tests/test_completeness.py``): real agents (ring, Numba kernel, punctuation, backlog and outbox), a real
Kafka broker, then what reached Kafka through the job's own steps (``PartitionProcessor``, ``JoinProcessor``) batch by batch. Every window is judged
against an oracle over every packet that was on the wire:

* wrong: its stored rows differ from the oracle's;
* flagged: a row says incomplete or the job listed it short (``_incomplete``), with a count of the cause;
* wrong and complete: the one outcome completeness must never produce (goal: 0);
* recall = flagged and wrong / wrong (goal 1.0); false alarms = flagged but exact (reported, a cost
  of charging a drop to every pane its interval spanned).

Causes: the capture socket's drops (a live AF_PACKET agent process on a veth pair in a namespace of
its own, paused with SIGSTOP while bursts overflow its one-block kernel ring: PACKET_STATISTICS
``tp_drops``; needs root, else left out and said so), ring drops (frames faster than a small ring
drains), host-late packets (block-sorted disorder past ``heartbeat.max_disorder``), a host killed
mid-window (timeout), a sequence gap (the broker deletes records the job had not read yet,
``delete_records``), select rows shed by the outbox in a Kafka outage (anti and inner join), and a
truncated capture (malformed: reported, not a loss, so its windows must be exact and unflagged).

    .venv/bin/python -m benchmarks.bench_completeness [--repeat N]   # full: every cause, 3 runs each
    .venv/bin/python -m benchmarks.bench_completeness --smoke        # every cause once (checks it works)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.harness import machine

RESULTS = Path(__file__).resolve().parent / "results"


def tally(cause: str, runs: list[list[Any]]) -> dict[str, Any]:
    """Per cause: windows judged, wrong, flagged, wrong and complete, recall, false alarms."""
    vs = [v for r in runs for v in r]
    wrong = sum(v.wrong for v in vs)
    caught = sum(v.wrong and v.flagged for v in vs)
    return {
        "cause": cause,
        "runs": len(runs),
        "windows": len(vs),
        "wrong": wrong,
        "flagged": sum(v.flagged for v in vs),
        "wrong_and_complete": wrong - caught,
        "recall": caught / wrong if wrong else None,
        "false_alarms": sum(v.flagged and not v.wrong for v in vs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per cause (the scenarios are seeded)")
    ap.add_argument("--smoke", action="store_true", help="every cause once: checks the bench works")
    args = ap.parse_args()
    if args.smoke:
        args.repeat = 1
    from local_stack.kafka_broker import KafkaBroker
    from lowwater_testing import faults as T
    from lowwater_testing.netns import NetnsUnavailable, veth_pair

    work = Path(tempfile.mkdtemp(prefix="lw-bench-completeness-"))
    broker = KafkaBroker("bench-completeness", port=0, state=work / "kafka")
    broker.start()

    def topic(partitions: int = 1) -> str:
        return broker.create_topic(f"bench-completeness-{uuid.uuid4().hex[:8]}", partitions)

    def live(run):
        def go():
            with veth_pair() as ends:
                return run(ends)

        return go

    scenarios = {
        "socket_drops": live(
            lambda ends: T.socket_drops(broker, topic, ends, Path(tempfile.mkdtemp(dir=work)))
        ),
        "ring_drops": lambda: T.ring_drops(broker, topic, "{range: 3s, slide: 1s}"),
        "host_late": lambda: T.disorder(broker, topic, "1s")[0],
        "timeout": lambda: T.killed_host(broker, topic),
        "gap": lambda: T.kafka_gap(broker, topic),
        "shed (anti join)": lambda: T.select_outage(broker, topic, "anti"),
        "shed (inner join)": lambda: T.select_outage(broker, topic, "inner"),
        "malformed (truncated pcap)": lambda: T.truncated_capture(Path(tempfile.mkdtemp(dir=work)))[0],
    }
    rows, left_out = [], {}
    try:
        for cause, run in scenarios.items():
            t0 = time.monotonic()
            try:
                r = tally(cause, [run() for _ in range(args.repeat)])
            except NetnsUnavailable as exc:
                left_out[cause] = str(exc)
                print(f"{cause:28s} left out: {exc}", flush=True)
                continue
            r["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(r)
            rec = "-" if r["recall"] is None else f"{r['recall']:.2f}"
            print(
                f"{cause:28s} windows {r['windows']:4d}  wrong {r['wrong']:3d}  flagged {r['flagged']:3d}  "
                f"wrong&complete {r['wrong_and_complete']:2d}  recall {rec:>4s}  false alarms {r['false_alarms']:3d}",
                flush=True,
            )
    finally:
        broker.stop()
    recalls = [r["recall"] for r in rows if r["recall"] is not None]
    out = {
        "benchmark": "completeness",
        "machine": machine(),
        "method": {"doc": __doc__, "repeat": args.repeat, "mode": "smoke" if args.smoke else "full"},
        "load_1min_at_end": os.getloadavg()[0],
        "left_out": left_out,
        "causes_tested": len({r["cause"].split(" ")[0] for r in rows}),
        "wrong_and_complete_total": sum(r["wrong_and_complete"] for r in rows),
        "recall_min": min(recalls) if recalls else None,
        "false_alarms_total": sum(r["false_alarms"] for r in rows),
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "completeness.json").write_text(json.dumps(out, indent=2))
    print(
        f"causes {out['causes_tested']}, wrong and complete {out['wrong_and_complete_total']}, "
        f"recall min {out['recall_min']}; wrote {RESULTS / 'completeness.json'}"
    )


if __name__ == "__main__":
    main()
