"""The central tier on real clusters, under faults: shared by ``tests/test_cluster.py`` and
``benchmarks/bench_recovery.py``.

* :func:`start_clusters`: a Spark standalone cluster (master + workers) and a 3-broker KRaft Kafka cluster
  (replication 3, ``min.insync.replicas`` 2), side by side on loopback.
* :class:`PacedHosts`: three emulated capture hosts (``lowwater_testing.oracle.host_messages``: partials and
  punctuation, real wire batches) streamed to Kafka at the pace of their data time, on and on, acks=all and
  idempotent, so a broker's death loses and duplicates nothing; it keeps when each message was handed over.
* :class:`JobProcess`: ``lowwater-job`` (the real CLI) on ``--master spark://...`` in a process group of its
  own, so :meth:`JobProcess.kill` SIGKILLs the driver (Python and its JVM) as a crash would.
* :class:`StoreWatch`: when each window became whole in the store, read as the API reads it
  (``high_level.serve.fileindex.FileIndex``: only the visible files), never by listing files here.
* :func:`recovery_of`: from the kill to the first window whose input was still arriving at the kill being whole.

Why windows are checked whole: a window's rows come from every Kafka partition; one partition's rows alone
say nothing about the other. So a window counts as closed when its final rows number the oracle's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from contract import query as Q
from high_level.serve.fileindex import FileIndex
from local_stack.kafka_broker import KafkaBrokerError
from local_stack.kafka_cluster import KafkaCluster
from local_stack.spark_cluster import SparkCluster
from lowwater_testing.oracle import Message, host_messages, interleave, split_hosts, window_oracle
from lowwater_testing.spark import expected_typed, normalised
from lowwater_testing.traffic import Traffic, oracle

REPO = Path(__file__).resolve().parents[1]
HOSTS = ("h0", "h1", "h2")


def start_clusters(work: Path, workers: int = 2, brokers: int = 3) -> tuple[SparkCluster, KafkaCluster]:
    """A standalone master with ``workers`` 1-core workers and a ``brokers``-node Kafka cluster, started
    side by side (JVM start-up is most of the cost); both stopped again if either fails."""
    spark = SparkCluster(work / "spark-cluster", workers=workers, cores=1, memory="768m")
    kafka: KafkaCluster | None = None
    try:
        spark.spawn()
        # a port picked free may be taken before the node binds it (shared machine), and at load 50 a node
        # can give up registering with the controller quorum ("exited during startup"): a new cluster, twice
        for attempt in range(3):
            try:
                kafka = KafkaCluster("lw-test", brokers, state=work / f"kafka-cluster-{attempt}").start(180)
                break
            except KafkaBrokerError:
                if attempt == 2:
                    raise
        spark.wait_ready(120)
    except BaseException:
        spark.stop()
        if kafka is not None:
            kafka.stop()
        raise
    return spark, kafka


def leader(cluster: KafkaCluster, topic: str, partition: int) -> int:
    """The node id leading ``partition`` of ``topic``."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=10_000)
    try:
        (d,) = admin.describe_topics([topic])
    finally:
        admin.close()
    return next(p["leader_id"] for p in d["partitions"] if p["partition_index"] == partition)


# acks from every in-sync replica, idempotent: a broker's death neither loses nor duplicates a record
PRODUCER = {"acks": "all", "enable_idempotence": True, "linger_ms": 2, "max_request_size": 8 << 20}
RETRIES = {"request_timeout_ms": 5000, "retry_backoff_ms": 200}


def idempotent_producer(bootstrap: str, delivery_timeout_ms: int):
    """A producer that fails over to a new partition leader and retries until ``delivery_timeout_ms``."""
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap, delivery_timeout_ms=delivery_timeout_ms, **PRODUCER, **RETRIES
    )


def host_stream(q: Q.QuerySpec, t: Traffic, skew_s: Sequence[float] = (0, 0.5, 1.0)) -> list[Message]:
    """Every emulated host's messages for ``q`` over ``t`` (split over :data:`HOSTS`), merged by send time;
    punctuation every second of data time and no end-of-stream mark (the stream stops where it is cut)."""
    rows = t.rows()
    hix = split_hosts(len(t), len(HOSTS), seed=3)
    streams = [
        host_messages(
            q,
            rows[hix == i],
            h,
            partitions=q.kafka.partitions,
            skew_ns=int(skew_s[i] * 1e9),
            punct_every_ns=10**9,
            seed=11 + i,
        )
        for i, h in enumerate(HOSTS)
    ]
    return interleave(streams, seed=5)


class PacedHosts(threading.Thread):
    """Sends ``msgs`` to ``topic`` at their send times (``speed`` x data time) until :meth:`cut` or the end;
    ``sent_at[i]`` is when message i was handed to the producer (monotonic seconds, NaN: not sent)."""

    def __init__(self, bootstrap: str, topic: str, msgs: list[Message], speed: float = 1.0) -> None:
        super().__init__(daemon=True, name="paced-hosts")
        self.bootstrap, self.topic, self.msgs, self.speed = bootstrap, topic, msgs, speed
        self.sent_at = np.full(len(msgs), np.nan)
        self.sent = 0
        self.failed: list[str] = []
        self._cut = threading.Event()

    def run(self) -> None:
        prod = idempotent_producer(self.bootstrap, 300_000)
        futures = []
        t_first = self.msgs[0].t_ns
        base = time.monotonic()
        try:
            for i, m in enumerate(self.msgs):
                wait = base + (m.t_ns - t_first) / 1e9 / self.speed - time.monotonic()
                if wait > 0 and self._cut.wait(wait):
                    break
                if self._cut.is_set():
                    break
                futures.append(prod.send(self.topic, value=m.value, partition=m.partition))
                self.sent_at[i] = time.monotonic()
                self.sent = i + 1
            prod.flush(300)
            for f in futures:
                try:
                    f.get(timeout=60)
                except Exception as exc:  # a lost record fails the run's exactness, with this reason
                    self.failed.append(repr(exc))
        finally:
            prod.close(10)

    def exhausted(self) -> bool:
        """Every message was handed over: no window closes on fresh input any more."""
        return self.sent >= len(self.msgs)

    def left_s(self) -> float:
        """Data seconds (at ``speed``) still to send."""
        if not self.sent:
            return (self.msgs[-1].t_ns - self.msgs[0].t_ns) / 1e9 / self.speed
        return (self.msgs[-1].t_ns - self.msgs[self.sent - 1].t_ns) / 1e9 / self.speed

    def cut(self) -> None:
        """Stop sending; :meth:`run` flushes what was handed over and checks every send was acknowledged."""
        self._cut.set()

    def last_mark(self) -> int:
        """The low-water mark of what was sent: min over (host, partition) of the last punctuation's mark."""
        last: dict[tuple[str, int], int] = {}
        for m in self.msgs[: self.sent]:
            if m.is_punctuation:
                last[(m.host, m.partition)] = int(m.mark_pane)
        want = {(h, p) for h in {m.host for m in self.msgs} for p in {m.partition for m in self.msgs}}
        return min(last.get(k, -1) for k in want)

    def closing_sent(self, windows: np.ndarray) -> np.ndarray:
        """Per tumbling window id w: when the last punctuation needed to close it (mark >= w + 1 from every
        host on every partition) was handed over; NaN if it was not sent."""
        out = np.full(len(windows), -np.inf)
        marks: dict[tuple[str, int], list[tuple[int, float]]] = {
            (h, p): [] for h in {m.host for m in self.msgs} for p in {m.partition for m in self.msgs}
        }
        for m, t in zip(self.msgs[: self.sent], self.sent_at[: self.sent], strict=True):
            if m.is_punctuation:
                marks[(m.host, m.partition)].append((int(m.mark_pane), float(t)))
        for seq in marks.values():
            mk = np.array([s[0] for s in seq], np.int64)
            ts = np.array([s[1] for s in seq], float)
            first = np.searchsorted(np.maximum.accumulate(mk), windows + 1)  # first punctuation past w
            if not len(ts):
                return np.full(len(windows), np.nan)  # a host sent no punctuation on a partition yet
            got = np.where(first < len(ts), ts[np.minimum(first, len(ts) - 1)], np.nan)
            out = np.maximum(out, got)  # NaN (not sent by one host) stays NaN
        return out


class JobProcess:
    """``lowwater-job`` on a standalone master, restartable on the same checkpoint and store."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.proc: subprocess.Popen | None = None
        self.starts: list[float] = []
        self.restarts: list[str] = []  # why the job exited by itself and was started again
        self._log_from, self._wall_start = 0, 0.0
        self._spans: list[tuple[int, float]] = []  # per start: (log offset, wall clock) at its launch

    def start(self) -> JobProcess:
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "high_level.cli", *self.argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # its own process group: the driver's JVM dies with it
        )
        out.close()
        self.starts.append(time.monotonic())
        self._wall_start = time.time()
        self._spans.append((self._log_from, self._wall_start))
        return self

    def kill(self) -> float:
        """SIGKILL the driver's whole process group (Python and its JVM) at once; the kill time."""
        assert self.proc is not None
        t = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        return t

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (the batch in flight finishes), SIGKILL after ``timeout``; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of the group is left (the JVM)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        return self.proc.returncode

    def _log_lines(self, start: int = -1) -> list[str]:
        """The log of start number ``start`` (its launch up to the next one's)."""
        begin = self._spans[start][0] if self._spans else self._log_from
        end = self._spans[start + 1][0] if -1 != start < len(self._spans) - 1 else None
        with self.log.open("rb") as f:
            f.seek(begin)
            data = f.read() if end is None else f.read(end - begin)
        return data.decode(errors="replace").splitlines()

    def _since_start(self, line: str, start: int = -1) -> float:
        wall = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # logging: local time
        return round(wall - (self._spans[start][1] if self._spans else self._wall_start), 1)

    def query_started_s(self) -> float | None:
        """Seconds from the latest start to the job's ``started ... mode`` line (Spark session up, queries
        started), from the log's own clock; None while it is not written."""
        for line in self._log_lines():
            if " INFO " in line and " started " in line and " mode for " in line:
                return self._since_start(line)
        return None

    def phases(self, checkpoint: Path, start: int = -1) -> dict[str, float | None]:
        """Where start number ``start``'s time went (read after its first batch committed: a window is in
        the store before its batch's commit), in seconds from its launch: ``session_s`` the Spark session
        (driver JVM, registration with the master: the job's first log line comes after it),
        ``queries_started_s`` the streams started (plans, the state schema's check), ``first_batch_s`` the
        first micro-batch committed (``checkpoint``'s ``*/commits``: executors' start, their Python workers,
        the state store's load, the replay of the batch in flight at a kill)."""
        lines = self._log_lines(start)
        stamped = [x for x in lines if x[:4].isdigit() and x[4:5] == "-" and x[23:24] == " "]
        began = [x for x in lines if " INFO " in x and " started " in x and " mode for " in x]
        wall = self._spans[start][1]
        until = self._spans[start + 1][1] if -1 != start < len(self._spans) - 1 else np.inf
        commits = [f.stat().st_mtime for f in checkpoint.glob("*/commits/[0-9]*")]
        after = [m for m in commits if wall <= m < until]
        return {
            "session_s": self._since_start(stamped[0], start) if stamped else None,
            "queries_started_s": self._since_start(began[0], start) if began else None,
            "first_batch_s": round(min(after) - wall, 1) if after else None,
        }

    def started_line(self) -> str:
        s = self.query_started_s()
        return (
            "the job's start not logged yet" if s is None else f"its queries started {s} s after its launch"
        )

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def check(self, max_restarts: int = 3) -> None:
        """A supervisor's round (``restart: unless-stopped``): a job that exited by itself is started again
        and the reason kept in ``restarts``; RuntimeError with the end of its log after ``max_restarts``.
        Why: on a loaded machine a query start can fail (a Python worker that does not connect back within
        Spark's fixed 10 s), and a deployment restarts the job; the time it costs counts in the recovery."""
        if self.proc is None or self.proc.poll() is None:
            return
        if len(self.restarts) >= max_restarts:
            raise RuntimeError(
                f"the job exited with {self.proc.returncode} {len(self.restarts) + 1} times:\n{self.tail()}"
            )
        errors = [x for x in self.tail(200_000).splitlines() if " ERROR lowwater" in x]
        self.restarts.append(
            f"exit {self.proc.returncode}: {errors[-1][:300] if errors else 'no ERROR line'}"
        )
        self.start()


def job_argv(
    cfg: Path, master: str, bootstrap: str, work: Path, hosts: Sequence[str] = HOSTS, trigger: str = "500ms"
) -> list[str]:
    """The job's flags on the standalone cluster: 2 executors of 1 core, 2 state partitions."""
    from local_stack.jars import spark_kafka_jars

    conf = {
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.driver.memory": "512m",
    }
    argv = [
        "--config",
        str(cfg),
        "--bootstrap",
        bootstrap,
        "--results",
        str(work / "results"),
        "--checkpoint",
        str(work / "ckpt"),
        "--master",
        master,
        "--driver-host",
        "127.0.0.1",
        "--shuffle-partitions",
        "2",
        "--trigger",
        trigger,
        "--host-timeout",
        "1h",  # the hosts never die here: an outage must not declare them dead
        "--expected-hosts",
        ",".join(hosts),
        "--compact-every",
        "0",
        "--spark-jars",
        ",".join(spark_kafka_jars()),
    ]
    for k, v in conf.items():
        argv += ["--spark-conf", f"{k}={v}"]
    return argv


def visible_rows(results: Path, q: Q.QuerySpec, columns: list[str] | None = None) -> pd.DataFrame:
    """Every row of ``q`` in the store's visible files, as the API's file index selects them."""
    idx = FileIndex(results)
    files = idx.files_in(q, [p for _, p in idx.date_dirs(q.name)])
    tables = [pq.read_table(f.path, columns=columns).to_pandas() for f in files]
    tables = [t for t in tables if len(t)]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=columns or ["window_end"])


class StoreWatch(threading.Thread):
    """Polls the store; ``whole_at[w]``: when window w first had all ``expected[w]`` final rows (monotonic s)."""

    def __init__(
        self, results: Path, q: Q.QuerySpec, expected: dict[int, int], every_s: float = 0.25
    ) -> None:
        super().__init__(daemon=True, name="store-watch")
        self.results, self.q, self.expected, self.every_s = results, q, expected, every_s
        self.whole_at: dict[int, float] = {}
        self.over: dict[int, int] = {}  # windows seen with more final rows than the oracle has
        self._halt = threading.Event()
        self._cache: dict[tuple[str, int, int], pd.Series] = {}
        self.error: str | None = None  # the last poll's failure, if any (shown when a wait times out)
        self._index = FileIndex(results)  # kept: it reads a file's footer once per size and mtime

    def counts(self) -> pd.Series:
        """Final rows per window id over the visible files (each file read once per size and mtime)."""
        idx = self._index
        files = idx.files_in(self.q, [p for _, p in idx.date_dirs(self.q.name)])
        parts = []
        for f in files:
            key = (f.path, f.size, f.mtime_ns)
            if key not in self._cache:
                t = pq.read_table(f.path, columns=["window_end", "kind"]).to_pandas()
                self._cache[key] = window_ids(
                    self.q, t.loc[t["kind"] == "final", "window_end"]
                ).value_counts()
            parts.append(self._cache[key])
        return pd.concat(parts).groupby(level=0).sum() if parts else pd.Series(dtype="int64")

    def run(self) -> None:
        while not self._halt.wait(self.every_s):
            try:
                c = self.counts()
            except Exception as exc:  # a file replaced under the read: the next poll sees it whole
                self.error = repr(exc)
                continue
            now = time.monotonic()
            for w, n in c.items():
                want = self.expected.get(int(w))
                if want is not None and n >= want and int(w) not in self.whole_at:
                    self.whole_at[int(w)] = now
                if want is None or n > want:
                    self.over[int(w)] = int(n)

    def stop(self) -> None:
        self._halt.set()

    def wait_whole(self, pred, timeout: float, why: str, job: JobProcess | None = None) -> float:
        """Wait until ``pred(whole_at)`` holds; TimeoutError naming ``why`` otherwise; the time it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(dict(self.whole_at)):
                return time.monotonic()
            if job is not None:
                job.check()
            time.sleep(0.1)
        raise TimeoutError(
            f"{why}: not within {timeout:g} s (whole windows: {len(self.whole_at)}, last poll error: {self.error})"
        )


def window_ids(q: Q.QuerySpec, window_end: pd.Series) -> pd.Series:
    """Tumbling window id of each ``window_end`` (window w ends at origin + (w + 1) x pane)."""
    end = pd.to_datetime(window_end, utc=True).astype("datetime64[ns, UTC]").astype("int64")
    return (end - q.window.origin_ns) // q.window.pane_ns - 1


def window_counts(q: Q.QuerySpec, t: Traffic) -> dict[int, int]:
    """Rows per tumbling window id in the oracle (cheap: no typed conversion)."""
    wo = window_oracle(q, oracle(q, t))
    return {int(w): int(n) for w, n in wo.groupby("window").size().items()}


def oracle_below(q: Q.QuerySpec, t: Traffic, below: int) -> pd.DataFrame:
    """The oracle in the store's typed form over tumbling windows ``< below``, with their ids (``wid``)."""
    e = expected_typed(q, t.take(t.ts < q.window.origin_ns + below * q.window.pane_ns))
    e["wid"] = window_ids(q, e["window_end"])
    return e


def exactness(
    results: Path, q: Q.QuerySpec, expected: pd.DataFrame, below: int, only: Collection[int] | None = None
) -> dict:
    """The visible store against the oracle over windows ``< below`` (those every host's sent mark passed):
    rows twice, rows missing, rows wrong, rows of windows that should not have closed. ``only``: just
    those window ids (e.g. the windows a fault interrupted), early rows then not counted."""
    got = visible_rows(results, q)
    fin = got[got["kind"] == "final"].copy() if len(got) else got
    keys = ["window_end", *[p.name for p in q.key_parts]]
    if not len(fin):
        fin = expected.iloc[:0]  # no row at all: every expected row is missing
    g = normalised(fin, q)
    wid = window_ids(q, g["window_end"])
    early = int((wid >= below).sum())
    keep = wid < below
    exp = expected[expected["wid"] < below]
    if only is not None:
        early = 0
        keep &= wid.isin(list(only))
        exp = exp[exp["wid"].isin(list(only))]
    g = g[keep]
    twice = int(g.duplicated(keys).sum())
    e = normalised(exp, q)
    m = e.merge(g.drop_duplicates(keys), on=keys, how="outer", suffixes=("", "_got"), indicator=True)
    missing = int((m["_merge"] == "left_only").sum())
    extra = int((m["_merge"] == "right_only").sum())
    both = m[m["_merge"] == "both"]
    bad = np.zeros(len(both), bool)
    for a in q.aggregates:
        x, y = both[a.name].to_numpy(float), both[f"{a.name}_got"].to_numpy(float)
        bad |= ~np.isclose(x, y, rtol=1e-12, atol=0)
    wrong = int(bad.sum())
    return {
        "windows_checked": int(e["window_end"].nunique()),
        "rows": len(g),
        "rows_expected": len(e),
        "rows_written_twice": twice,
        "rows_missing": missing,
        "rows_not_in_oracle": extra,
        "rows_wrong": wrong,
        "rows_of_windows_closed_early": early,
        "exact": twice == missing == extra == wrong == early == 0,
    }


def recovery_of(
    t_kill: float, whole_at: dict[int, float], closing_sent: dict[int, float]
) -> dict[str, float | None]:
    """From the kill: ``next_window_s`` until any window not yet whole became whole; ``recovery_s`` until the
    first window whose closing punctuation was sent after the kill became whole (the pipeline runs again)."""
    after = [t for w, t in whole_at.items() if t > t_kill]
    fresh = [(t, w) for w, t in whole_at.items() if closing_sent.get(w, -np.inf) >= t_kill]
    first = min(fresh) if fresh else None
    return {
        "next_window_s": round(min(after) - t_kill, 2) if after else None,
        "recovery_s": round(first[0] - t_kill, 2) if first else None,
        "recovery_window": int(first[1]) if first else None,
    }


def interrupted(t_kill: float, whole_at: dict[int, float], recovery_window: int | None) -> list[int]:
    """The windows a fault interrupted: not whole at the kill, up to the first window closed on fresh input
    (its replayed or delayed backlog and the recovery's own window)."""
    if recovery_window is None:
        return []
    return sorted(w for w, t in whole_at.items() if t > t_kill and w <= recovery_window)


def close_latency(whole_at: dict[int, float], closing_sent: dict[int, float]) -> dict[int, float]:
    """Per window: from the handing over of its closing punctuation to being whole in the store (s)."""
    return {w: t - closing_sent[w] for w, t in whole_at.items() if np.isfinite(closing_sent.get(w, np.nan))}


def fresh_windows(whole_at: dict[int, float], hosts: PacedHosts, since: float) -> list[int]:
    """Windows that closed on input handed over at or after ``since``: whole after it, and their closing
    punctuation (the mark past their end from every host on every partition) was sent after it. A window
    of the backlog (input sent before ``since``, replayed or caught up) never counts."""
    new = np.array(sorted(w for w, t in whole_at.items() if t > since), np.int64)
    if not len(new):
        return []
    return new[hosts.closing_sent(new) >= since].tolist()


def _wait_fresh(
    watch: StoreWatch,
    hosts: PacedHosts,
    since: float,
    n: int,
    timeout: float,
    why: str,
    job: JobProcess,
    *,
    steady: bool,
) -> list[int]:
    """Wait until ``n`` windows closed on input sent after ``since`` (:func:`fresh_windows`); those windows.

    ``steady`` (the wait before a fault, or before the end; ``since``: the previous fault's kill): a count
    relative to ``since``, never an absolute number of windows (which a replay's backlog may already reach,
    or a short stream never), and it ends as well when the hosts' stream ended (the end's wait for every window below the last mark takes over).
    Otherwise (a recovery) a stream that ended before ``since`` fails at once: nothing can close on fresh input."""
    deadline = time.monotonic() + timeout
    while True:
        got = fresh_windows(dict(watch.whole_at), hosts, since)
        if len(got) >= n:
            return got
        if hosts.exhausted():
            if steady:
                return got
            if hosts.sent_at[-1] < since:
                raise RuntimeError(f"{why}: the hosts' stream ended before the fault (give a longer stream)")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{why}: {len(got)} of {n} windows closed on input sent after it within {timeout:g} s "
                f"(whole windows: {len(watch.whole_at)}, last poll error: {watch.error})"
            )
        job.check()
        time.sleep(0.5)


class BrokerRestart(threading.Thread):
    """A SIGKILLed broker started again in the background (a JVM start: the run goes on meanwhile).

    The thread stays parked once the broker serves: the broker is launched under ``setpriv --pdeathsig``,
    and Linux sends that signal when the launching *thread* exits, so a thread that returned would take
    the broker down with it. It ends with the process, as the main thread's brokers do."""

    def __init__(self, node, log) -> None:
        super().__init__(daemon=True, name="broker-restart")
        self.node, self.log = node, log
        self.took_s: float | None = None
        self.error: str | None = None
        self.done = threading.Event()

    def run(self) -> None:
        t = time.monotonic()
        try:
            self.node.start(180)
            self.took_s = round(time.monotonic() - t, 2)
            self.log(f"broker {self.node.node_id} back (serving) after {self.took_s} s")
        except Exception as exc:  # reported in the results; the run goes on on two brokers
            self.error = repr(exc)[:500]
            self.log(f"broker {self.node.node_id} failed to restart: {self.error}")
        finally:
            self.done.set()
        threading.Event().wait()  # parked: see the class docstring

    def wait(self, timeout: float) -> bool:
        """Whether the restart ended (served or failed) within ``timeout`` s."""
        return self.done.wait(timeout)


@dataclass(frozen=True)
class Stream:
    """The emulated hosts' traffic: packets/s over the three, distinct (src, dst) groups, data seconds."""

    rate: float = 300.0
    groups: int = 400
    seconds: int = 900


def recovery_run(
    master: str,
    kafka: KafkaCluster,
    work: Path,
    faults: Sequence[str] = ("job", "broker"),
    *,
    stream: Stream = Stream(),
    steady_windows: int = 3,
    timeouts: tuple[float, float] = (300.0, 600.0),  # a wait; the job's start (slow on a loaded machine)
    budget_s: float = float("inf"),
    reserve_s: float = 60.0,
    log=print,
    clock_from: float | None = None,
) -> dict:
    """Stream three emulated hosts into ``kafka`` while the job runs on ``master``; inject ``faults`` in turn
    (``job``: SIGKILL the driver, restart it at once from its checkpoint; ``broker``: SIGKILL the leader of
    partition 0, restart it once windows close again), each after ``steady_windows`` windows closed; cut
    the stream, wait for every window below the hosts' last mark and check the store against the oracle.
    Bounded: a fault is skipped (``faults_skipped``) when less than its kind's longest cycle so far plus
    ``reserve_s`` (the end: cut, last windows, oracle) is left of ``budget_s``; ``log`` gets a line per step."""
    import uuid

    timeout, start_timeout = timeouts
    from lowwater_testing.queries import config, query
    from lowwater_testing.traffic import make_traffic

    t_begin = time.monotonic()
    t_clock = t_begin if clock_from is None else clock_from  # progress lines count from here

    def step(what: str) -> None:
        log(f"[{time.monotonic() - t_clock:6.1f} s] {what}")

    work.mkdir(parents=True, exist_ok=True)
    topic = kafka.create_topic(f"lw-recovery-{uuid.uuid4().hex[:8]}", 2, {"min.insync.replicas": "2"})
    step(f"topic {topic} created (2 partitions, 3 replicas)")
    cfg = work / "q.yaml"
    aggs = ["count as packets", "sum(length) as bytes", "max(ttl) as max_ttl"]
    config(
        query(
            "recovery", group_by=["src_ip", "dst_ip"], aggregates=aggs, window="2s", topic=topic, partitions=2
        )
    ).write(cfg)
    q = Q.load(cfg).queries[0]
    pane = q.window.pane_ns
    job = JobProcess(job_argv(cfg, master, kafka.bootstrap_servers, work), work / "job.log")
    events: list[dict] = []
    restarts: list[BrokerRestart] = []
    skipped: list[str] = []
    hosts: PacedHosts | None = None
    watch: StoreWatch | None = None
    t_start = time.monotonic()
    try:
        job.start()  # the driver boots (JVM, executors, queries) while this process generates the stream
        step("job launched; generating the hosts' stream meanwhile")
        t_gen = time.monotonic()
        t0 = time.time_ns() // pane * pane
        t = make_traffic(
            int(stream.rate * stream.seconds), stream.groups, t0, stream.seconds * 10**9, seed=23
        )
        counts = window_counts(q, t)
        msgs = host_stream(q, t)
        gen_s = round(time.monotonic() - t_gen, 1)
        step(
            f"stream generated in {gen_s} s: {len(t):,} packets, {len(msgs):,} messages, {len(counts)} windows"
        )
        hosts = PacedHosts(kafka.bootstrap_servers, topic, msgs)
        watch = StoreWatch(work / "results", q, counts)
        hosts.start()
        watch.start()
        step(f"hosts streaming ({job.started_line()})")
        first = watch.wait_whole(lambda w: len(w) >= 1, start_timeout, "the job's first window", job)
        # steady: windows closed on input sent after the job's first window, then after each fault's kill
        since = first

        def settle(why: str) -> None:  # steady_windows closed on input sent after ``since``
            _wait_fresh(watch, hosts, since, steady_windows, timeout, why, job, steady=True)

        step(f"first window whole {first - t_start:.1f} s after the job's start ({job.started_line()})")
        cycle: dict[str, float] = {}  # the longest fault cycle of each kind so far (s)
        for i, kind in enumerate(faults):
            left = budget_s - (time.monotonic() - t_begin)
            if kind in cycle and left < cycle[kind] + reserve_s:  # bounded: the run ends within its budget
                skipped = list(faults[i:])
                step(
                    f"{len(skipped)} faults skipped: {left:.0f} s of the budget left, a {kind} cycle took {cycle[kind]:.0f} s"
                )
                break
            if hosts.left_s() < cycle.get(kind, 60.0) + 60.0:  # a fault needs input after it to recover on
                skipped = list(faults[i:])
                step(f"{len(skipped)} faults skipped: the hosts' stream ends in {hosts.left_s():.0f} s")
                break
            t_cycle = time.monotonic()
            settle(f"steady before the {kind} fault")
            if kind == "job":
                t_kill = job.kill()
                step("job fault: driver SIGKILLed (Python + JVM), started again from its checkpoint")
                job.start()
                _wait_fresh(
                    watch, hosts, t_kill, 1, start_timeout, "after the driver's SIGKILL", job, steady=False
                )
                ev = {
                    "fault": "job",
                    "what": "driver SIGKILLed (Python + JVM), restarted at once",
                    "_start": len(job.starts) - 1,  # its phases are read at the end
                }
                step(
                    f"windows close again {time.monotonic() - t_kill:.1f} s after the kill ({job.started_line()})"
                )
            elif kind == "broker":
                for r in restarts:  # the last victim is back first: two brokers down refuse acks=all writes
                    r.wait(240)
                node = leader(kafka, topic, 0)
                victim = kafka.nodes[node - 1]
                t_kill = time.monotonic()
                victim.kill()
                step(f"broker fault: broker {node} (leader of partition 0) SIGKILLed")
                _wait_fresh(watch, hosts, t_kill, 1, timeout, "after a broker's SIGKILL", job, steady=False)
                step(
                    f"windows close again {time.monotonic() - t_kill:.1f} s after the kill; broker {node} restarting"
                )
                restart = BrokerRestart(victim, step)
                restart.start()
                restarts.append(restart)
                ev = {
                    "fault": "broker",
                    "what": f"broker {node} (leader of partition 0) SIGKILLed, restarted after windows closed again",
                    "_restart": restart,
                }
            else:
                raise ValueError(f"unknown fault {kind!r}")
            ev["t_kill_s"] = round(t_kill - t_start, 2)
            ev["_t_kill"] = t_kill
            events.append(ev)
            since = t_kill  # the next steady wait counts the windows closed on input sent after this fault
            cycle[kind] = max(cycle.get(kind, 0.0), time.monotonic() - t_cycle)
        for r in restarts:  # a broker rejoins before the next broker fault, and before the end
            r.wait(240)
        settle("steady after the faults")
        hosts.cut()
        hosts.join(600)
        below = hosts.last_mark()
        todo = [w for w in counts if w < below]
        step(
            f"stream cut after {hosts.sent:,} messages; waiting for the {len(todo)} windows below its last mark"
        )
        watch.wait_whole(
            lambda w: all(x in w for x in todo), timeout, "every window below the hosts' last mark"
        )
        step("every window below the last mark whole; stopping the job")
    finally:
        if watch is not None:
            watch.stop()
        if hosts is not None:
            hosts.cut()
        code = job.stop()
    if hosts.failed:
        raise AssertionError(f"{len(hosts.failed)} sends not acknowledged: {hosts.failed[:3]}")
    wins = np.array(sorted(watch.whole_at), np.int64)
    sent = dict(zip(wins.tolist(), hosts.closing_sent(wins).tolist(), strict=True))
    expected = oracle_below(q, t, below)
    for ev in events:
        t_kill = ev.pop("_t_kill")
        ev.update(recovery_of(t_kill, watch.whole_at, sent))
        across = interrupted(t_kill, watch.whole_at, ev["recovery_window"])
        exa = exactness(work / "results", q, expected, below, only=across)
        ev["windows_across"] = len(across)  # not whole at the kill, up to the recovery's window
        ev["exact_across"] = bool(across) and exa["exact"] and exa["windows_checked"] == len(across)
        ev["rows_across"] = {k: exa[k] for k in ("rows", "rows_written_twice", "rows_missing", "rows_wrong")}
        if "_start" in ev:  # where the restart's time went
            ev["restart_phases"] = job.phases(work / "ckpt", ev.pop("_start"))
        r = ev.pop("_restart", None)
        if r is not None:
            ev["broker_restart_s"] = r.took_s
            if r.error:
                ev["broker_restart_error"] = r.error
    step(f"store checked against the oracle ({len(events)} faults)")
    lat = close_latency(watch.whole_at, sent)
    t_first_fault = min((ev["t_kill_s"] for ev in events), default=np.inf) + t_start
    # steady: windows closed on input sent once the job ran (not the backlog of its start), before a fault
    steady = [v for w, v in lat.items() if sent[w] >= first and watch.whole_at[w] < t_first_fault]
    ex = exactness(work / "results", q, expected, below)
    transient = sum(n - counts.get(w, 0) for w, n in watch.over.items())
    return {
        "topic_partitions": 2,
        "hosts": len(HOSTS),
        "packets_per_s": stream.rate,
        "groups": stream.groups,
        "window_s": pane / 1e9,
        "messages_sent": hosts.sent,
        "windows_closed": len(watch.whole_at),
        "job_exit_code": code,
        "job_restarts_by_supervisor": job.restarts,
        "job_first_window_s": round(first - t_start, 2),
        "job_first_start_phases": job.phases(
            work / "ckpt", 0
        ),  # JobProcess.phases: session, queries, first batch
        "stream_generation_s": gen_s,
        "run_s": round(time.monotonic() - t_begin, 1),
        "faults_done": [ev["fault"] for ev in events],
        "faults_skipped": skipped,
        "steady_close_latency_s": round(float(np.median(steady)), 2) if steady else None,
        "max_close_latency_s": round(max(lat.values()), 2) if lat else None,
        "events": events,
        **ex,
        "rows_seen_over_the_oracle": int(transient),  # at any poll, not only at the end
        "rows_written_twice": int(max(ex["rows_written_twice"], transient)),
        "timeline": [
            {"t_s": round(watch.whole_at[w] - t_start, 2), "window": int(w), "close_latency_s": round(v, 3)}
            for w, v in sorted(lat.items())
        ],
    }
