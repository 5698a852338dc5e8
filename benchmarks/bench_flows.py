"""Flow collection throughput: IPFIX records per CPU-second and the highest loss-free rate, lowwater vs nfcapd.

One export, made once: softflowd exports a synthetic pcap as IPFIX (flows of several packets). The same
datagrams then go (1) through lowwater's decoder and weighted kernel in memory (the per-core work of
``flows:`` collection, no socket), (2) over UDP to a lowwater flow collector (``FlowAgent``, the real
loop: batched receive, decode, fold, punctuate, emit to a stand-in producer) in its own process, and
(3) over UDP to ``nfcapd``. Both collectors' CPU is the whole process's (utime + stime of every thread,
idle waits included; nfcapd's until it exited, its last file write included), read in clock ticks, so each measure is repeated (more passes of the export, sent at
``--rate`` records/s) until it holds at least ``--min-cpu-s``; ``vs_nfcapd`` is lowwater's records per
CPU-second over nfcapd's, given only when both counted every record.

**Loss-free rate.** Then the export is sent at rising rates (``--rates``, records/s, about
``--step-s`` each) to both collectors in turn; a rate is loss-free for a collector when its record count
equals what was sent. The highest loss-free rate of each (what the sender reached, records/s) goes into
``loss_free_rate_lowwater`` / ``loss_free_rate_nfcapd``; each sweep stops at its first loss, and a step
whose rate the (Python, same machine) sender could not reach is marked ``sender_bound``.

Run: ``.venv/bin/python -m benchmarks.bench_flows [--packets 300000]``; ``--smoke`` for a quick check.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import machine
from benchmarks.proccpu import tree_cpu_seconds
from contract import query as Q
from low_level.flows.kernel import FlowKernel
from low_level.flows.source import FlowCollector
from low_level.kernel.tables import Tables
from lowwater_testing.queries import config, query

QUERY = config(
    query(
        "pairs",
        group_by=["src_ip", "dst_ip"],
        aggregates=["count as packets", "sum(length) as bytes"],
        table=65536,
    )
).text


def export(packets: int, tmp: Path) -> list[bytes]:
    from lowwater_testing.flows import flow_pcap, softflowd_export

    pcap = tmp / "t.pcap"
    flow_pcap(pcap, packets, seed=1)
    datagrams, _ = softflowd_export(pcap, "10", tmp)
    return datagrams


def _send(
    datagrams: list[bytes], port: int, passes: int, per_s: float, ready: Any, go: Any, took: Any
) -> None:
    """Once ``go`` is set, the export ``passes`` times at ``per_s`` datagrams a second (paced on a
    deadline, 16 at a time); the seconds the sending took into ``took``."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
    ready.set()
    go.wait()
    t0, i = time.perf_counter(), 0
    for _ in range(passes):
        for x in datagrams:
            tx.sendto(x, ("127.0.0.1", port))
            i += 1
            if i % 16 == 0 and (ahead := t0 + i / per_s - time.perf_counter()) > 0:
                time.sleep(ahead)
    took.value = time.perf_counter() - t0


def send(datagrams: list[bytes], port: int, passes: int, per_s: float, cpu_of: int) -> tuple[float, float]:
    """Send from a process of its own (its CPU is not the collector's), started before the clock: returns
    the seconds the sending took and the CPU seconds of process ``cpu_of`` before it began."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, took = ctx.Event(), ctx.Event(), ctx.Value("d", 0.0)
    p = ctx.Process(target=_send, args=(datagrams, port, passes, per_s, ready, go, took))
    p.start()
    assert ready.wait(120), "the sender did not start"  # its start-up is over before the clock starts
    c0 = tree_cpu_seconds(cpu_of)
    go.set()
    p.join()
    return took.value, c0


def _agent(port: Any, records: Any, stop: Any) -> None:
    """The lowwater collector process: a FlowAgent on a free port, publishing its record count."""
    import os

    from low_level.flows.agent import FlowAgent
    from lowwater_testing.capture import RecordingProducer

    spec = {"host": "127.0.0.1", "port": 0}
    agent = FlowAgent(Q.load_text(QUERY).queries, spec, "bench", None, producer=RecordingProducer())
    process = agent.process

    def counted() -> int:
        n = process()
        records.value = agent.collector.records
        return n

    agent.process = counted  # type: ignore[method-assign]
    threading.Thread(target=lambda: (stop.wait(), os._exit(0)), daemon=True).start()
    port.value = agent.collector.port
    agent.run(exit_at_end=False)


class Lowwater:
    """The lowwater collector process, started once for every measure."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.port, self.records, self.stop = ctx.Value("i", 0), ctx.Value("q", 0), ctx.Event()
        self.proc = ctx.Process(target=_agent, args=(self.port, self.records, self.stop))
        self.proc.start()
        deadline = time.monotonic() + 300
        while not self.port.value and self.proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.port.value, "the lowwater flow collector did not start"

    def warm(self, datagrams: list[bytes], one: int) -> None:
        """One pass outside every measure: templates, and the first flush and emit (compiled on first use)."""
        self.run(datagrams, 1, 10_000.0, one)

    def run(self, datagrams: list[bytes], passes: int, per_s: float, want: int) -> tuple[int, float, float]:
        """Send; wait until the count reaches what was sent (or stops moving for 2 s): (records, CPU, wall)."""
        r0 = self.records.value
        wall, c0 = send(datagrams, self.port.value, passes, per_s, self.proc.pid)
        last, still = -1, time.monotonic()
        while self.records.value - r0 < want and time.monotonic() - still < 2:
            if self.records.value != last:
                last, still = self.records.value, time.monotonic()
            time.sleep(0.01)
        return self.records.value - r0, tree_cpu_seconds(self.proc.pid) - c0, wall

    def close(self) -> None:
        self.stop.set()
        self.proc.join(30)


def nfcapd_run(datagrams: list[bytes], passes: int, per_s: float, tmp: Path) -> tuple[int, float, float]:
    """A fresh nfcapd for one measure (its count is read from its file once it has stopped): (records,
    CPU, wall)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    d = Path(tempfile.mkdtemp(dir=tmp))
    proc = subprocess.Popen(
        ["nfcapd", "-p", str(port), "-b", "127.0.0.1", "-w", str(d), "-t", "3600", "-B", str(1 << 24)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _listening(port):
            time.sleep(0.02)
        wall, c0 = send(datagrams, port, passes, per_s, proc.pid)
        time.sleep(1.0)  # what is still in its socket
    finally:
        proc.terminate()
    # its CPU until it exited (rusage of the reaped process, every thread): the records it still held
    # are written to its file at exit, work lowwater's measure includes (its emit runs as it goes)
    _, _, use = os.wait4(proc.pid, 0)
    proc.returncode = 0
    cpu = use.ru_utime + use.ru_stime - c0
    files = sorted(p for p in d.iterdir() if p.name.startswith("nfcapd."))
    flows = 0
    for f in files:
        out = subprocess.run(
            ["nfdump", "-I", "-r", str(f)], capture_output=True, text=True, check=True
        ).stdout
        flows += int(next(line.split(":")[1] for line in out.splitlines() if line.startswith("Flows:")))
    return flows, cpu, wall


def _listening(port: int) -> bool:
    """Whether a UDP socket is bound to the port on 127.0.0.1 (from /proc/net/udp)."""
    want = f"0100007F:{port:04X}"
    return any(line.split()[1] == want for line in Path("/proc/net/udp").read_text().splitlines()[1:])


def until_cpu(round_fn, first: int, min_cpu: float, max_wall_s: float) -> tuple[int, float, int, bool]:
    """Run ``round_fn(passes) -> (records, cpu_s)`` until the CPU it measured adds up to ``min_cpu`` (a
    second or more: CPU is read in clock ticks, 10 ms each) or ``max_wall_s`` has passed.

    Each next round is sized from the CPU per pass measured so far. Returns (records, cpu_s, passes, reached).
    """
    records, cpu, passes, n = 0, 0.0, 0, first
    t0 = time.monotonic()
    while True:
        r, c = round_fn(n)
        records, cpu, passes = records + r, cpu + c, passes + n
        if cpu >= min_cpu or time.monotonic() - t0 > max_wall_s:
            return records, cpu, passes, cpu >= min_cpu
        per_pass = cpu / passes
        n = passes * 10 if per_pass <= 0 else max(1, math.ceil((min_cpu - cpu) / per_pass * 1.2))


def lowwater_memory(datagrams: list[bytes], repeat: int, min_cpu: float, max_wall_s: float) -> tuple:
    tables = Tables.build(Q.load_text(QUERY).queries, chunk=1 << 14)
    k = FlowKernel(tables)
    k.warm()
    col = FlowCollector()
    col.warm()
    k.warm_take(col)
    col.feed(datagrams)  # templates first, outside the clock
    k.take(col, lambda: tables.drain(0))

    def passes(n: int) -> tuple[int, float]:
        records, cpu = 0, 0.0
        for _ in range(n):
            col.feed(datagrams)
            t0 = time.process_time()
            records += k.take(col, lambda: tables.drain(0))  # what the agent runs per receive batch
            cpu += time.process_time() - t0
        return records, cpu

    return until_cpu(passes, repeat, min_cpu, max_wall_s)


def sweep(run, rates: list[float], one: int, per_pass: int, step_s: float) -> tuple[float | None, list]:
    """``run(passes, datagrams_per_s) -> (records, cpu, wall)`` at each rate (records/s) until a loss;
    returns the highest loss-free rate reached (records/s) and the steps."""
    best, steps = None, []
    for rate in rates:
        per_s = rate / one * per_pass  # datagrams a second
        passes = max(1, round(rate * step_s / one))
        got, _, wall = run(passes, per_s)
        sent = one * passes
        reached = sent / wall
        step = {"rate": rate, "sent": sent, "counted": got, "reached": round(reached)}
        step["sender_bound"] = reached < 0.9 * rate
        steps.append(step)
        if got != sent:
            break
        best = max(best or 0, round(reached))
        if step["sender_bound"]:
            break
    return best, steps


def _rate(n: int, cpu: float) -> int | None:
    return round(n / cpu) if cpu > 0 else None


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--packets", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=10, help="passes of the export in each first round")
    ap.add_argument("--rate", type=float, default=250_000, help="records/s sent for the CPU measures")
    ap.add_argument("--rates", default="250e3,500e3,1e6,2e6,4e6,8e6", help="loss-free sweep, records/s")
    ap.add_argument("--step-s", type=float, default=2.0, help="seconds of sending per sweep step")
    ap.add_argument("--min-cpu-s", type=float, default=1.0, help="CPU each collector's measure must reach")
    ap.add_argument("--max-wall-s", type=float, default=600.0, help="per collector: stop short after this")
    ap.add_argument("--smoke", action="store_true", help="a small export, 0.2 CPU-s, short sweep steps")
    a = ap.parse_args(argv)
    if a.smoke:
        a.packets, a.repeat, a.min_cpu_s, a.step_s, a.max_wall_s = 50_000, 2, 0.2, 0.5, 60.0
    m = machine()
    rates = [float(x) for x in a.rates.split(",")]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        datagrams = export(a.packets, tmp)
        per_pass = len(datagrams)
        col = FlowCollector()
        col.feed(datagrams)
        one = col.decode().n
        per_s = a.rate / one * per_pass
        lim = (a.min_cpu_s, a.max_wall_s)
        mem_n, mem_cpu, mem_p, mem_ok = lowwater_memory(datagrams, a.repeat, *lim)
        lw = Lowwater()
        try:
            lw.warm(datagrams, one)
            sock_n, sock_cpu, sock_p, sock_ok = until_cpu(
                lambda n: lw.run(datagrams, n, per_s, one * n)[:2], a.repeat, *lim
            )
            lw_best, lw_steps = sweep(
                lambda n, r: lw.run(datagrams, n, r, one * n), rates, one, per_pass, a.step_s
            )
        finally:
            lw.close()
        nf_n, nf_cpu, nf_p, nf_ok = until_cpu(
            lambda n: nfcapd_run(datagrams, n, per_s, tmp)[:2], a.repeat, *lim
        )
        nf_best, nf_steps = sweep(
            lambda n, r: nfcapd_run(datagrams, n, r, tmp), rates, one, per_pass, a.step_s
        )
    counted = mem_n == one * mem_p and sock_n == one * sock_p and nf_n == one * nf_p
    enough = mem_ok and sock_ok and nf_ok
    sock_r, nf_r = _rate(sock_n, sock_cpu), _rate(nf_n, nf_cpu)
    res = {
        "machine": m,
        "export": {
            "pcap_packets": a.packets,
            "datagrams": per_pass,
            "records": one,
            "repeat": a.repeat,
            "exporter": "softflowd 1.1.0 -v 10 -A milli",
        },
        "min_cpu_s": a.min_cpu_s,
        "send_rate": a.rate,
        "records_per_s": _rate(mem_n, mem_cpu),
        "lowwater_memory": {"records": mem_n, "passes": mem_p, "cpu_s": round(mem_cpu, 3)},
        "lowwater_socket": {
            "records": sock_n,
            "passes": sock_p,
            "cpu_s": round(sock_cpu, 3),
            "records_per_cpu_s": sock_r,
        },
        "nfcapd": {"records": nf_n, "passes": nf_p, "cpu_s": round(nf_cpu, 3), "records_per_cpu_s": nf_r},
        "all_records_counted": counted,
        "every_cpu_at_least_min": enough,
        "vs_nfcapd": round(sock_r / nf_r, 2) if counted and enough and sock_r and nf_r else None,
        "loss_free_rate_lowwater": lw_best,
        "loss_free_rate_nfcapd": nf_best,
        "sweep": {"lowwater": lw_steps, "nfcapd": nf_steps},
        "smoke": a.smoke,
    }
    print(f"machine: {m['cpu']} ({m['cores']} cores)")
    print(
        f"export: {one} records in {per_pass} datagrams; passes: memory {mem_p}, socket {sock_p}, nfcapd {nf_p}"
    )
    print(
        f"lowwater decode+aggregate (memory): {res['records_per_s']} records/s per core ({mem_cpu:.2f} CPU-s)"
    )
    print(f"lowwater collector via UDP: {sock_r} records per CPU-s ({sock_cpu:.2f} CPU-s)")
    print(f"nfcapd via UDP:             {nf_r} records per CPU-s ({nf_cpu:.2f} CPU-s)")
    print(f"vs_nfcapd (per CPU-s): {res['vs_nfcapd']}; every record counted: {counted}")
    print(f"highest loss-free rate, records/s: lowwater {lw_best}, nfcapd {nf_best}")
    for name, steps in res["sweep"].items():
        for s in steps:
            print(f"  {name}: {s}")
    if not enough:
        print(
            f"a collector's measure stayed under {a.min_cpu_s} CPU-s within {a.max_wall_s} s", file=sys.stderr
        )
    if not counted:
        print(
            f"record counts differ (want {one} per pass): memory {mem_n}, socket {sock_n}, nfcapd {nf_n}",
            file=sys.stderr,
        )
    harness.RESULTS.mkdir(exist_ok=True)
    harness.write_results("flows.json", res, indent=1)


if __name__ == "__main__":
    main()
