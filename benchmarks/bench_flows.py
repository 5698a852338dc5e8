"""Flow collection throughput: IPFIX records decoded and aggregated per CPU-second, lowwater vs nfcapd.

One export, made once: softflowd exports a synthetic pcap as IPFIX (flows of several packets). The same
datagrams then go (1) through lowwater's decoder and weighted kernel in memory (the per-core work of
``flows:`` collection, no socket), (2) through lowwater over a UDP socket (receive + decode +
aggregate; CPU of the calls that received something, so the Python loop's idle polls are left out),
and (3) to ``nfcapd`` over UDP, whose whole CPU time (utime + stime, clock ticks) is read from /proc:
it blocks in recvfrom when idle. Rates are records per CPU-second of the collecting process, so the
sender's pace does not enter them; ``vs_nfcapd`` is given only when every collector counted every
record. Each collector's measure is repeated (more passes of the export) until it holds at least
``--min-cpu-s`` of its CPU: nfcapd's is read in clock ticks, and a short run rounds to zero.

Run: ``.venv/bin/python -m benchmarks.bench_flows [--packets 300000] [--repeat 20]``.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import machine
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


def _cpu_of(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _send(datagrams: list[bytes], port: int, repeat: int, gap_s: float) -> None:
    import socket

    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(repeat):
        for x in datagrams:
            tx.sendto(x, ("127.0.0.1", port))
            if gap_s:
                time.sleep(gap_s)


def until_cpu(round_fn, first: int, min_cpu: float, max_wall_s: float) -> tuple[int, float, int, bool]:
    """Run ``round_fn(passes) -> (records, cpu_s)`` until the CPU it measured adds up to ``min_cpu`` (a
    second or more: nfcapd's CPU is read in clock ticks, 10 ms each) or ``max_wall_s`` has passed.

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
    q = Q.load_text(QUERY).queries
    tables = Tables.build(q, chunk=1 << 14)
    k = FlowKernel(tables)
    k.warm()
    col = FlowCollector(buffer_bytes=1 << 26)
    col.warm()
    col.feed(datagrams)  # templates first, outside the clock
    while col.pending:
        col.decode()

    def passes(n: int) -> tuple[int, float]:
        records, cpu = 0, 0.0
        for _ in range(n):
            col.feed(datagrams)
            t0 = time.process_time()
            while col.pending:
                b = col.decode()
                for s in range(0, b.n, tables.chunk):
                    e = min(b.n, s + tables.chunk)
                    k.run(b.rows[s:e], b.weights[s:e], e - s)
                    tables.drain(0)
                records += b.n
            cpu += time.process_time() - t0
        return records, cpu

    return until_cpu(passes, repeat, min_cpu, max_wall_s)


def lowwater_socket(
    datagrams: list[bytes], repeat: int, gap_s: float, min_cpu: float, max_wall_s: float
) -> tuple:
    q = Q.load_text(QUERY).queries
    tables = Tables.build(q, chunk=1 << 14)
    k = FlowKernel(tables)
    k.warm()
    col = FlowCollector(buffer_bytes=1 << 26).open()
    col.warm()

    def passes(n: int) -> tuple[int, float]:
        sender = multiprocessing.get_context("spawn").Process(
            target=_send, args=(datagrams, col.port, n, gap_s)
        )
        sender.start()
        records, idle, cpu = 0, 0, 0.0
        while idle < 2000:
            t0 = time.process_time()  # CPU of receiving and folding only: an idle poll is the loop's
            got = col.receive()
            while col.pending:
                b = col.decode()
                for s in range(0, b.n, tables.chunk):
                    e = min(b.n, s + tables.chunk)
                    k.run(b.rows[s:e], b.weights[s:e], e - s)
                    tables.drain(0)
                records += b.n
            if got:
                cpu += time.process_time() - t0
            else:
                idle = idle + 1 if not sender.is_alive() else 0
                time.sleep(0.0005)
        sender.join()
        return records, cpu

    try:
        return until_cpu(passes, repeat, min_cpu, max_wall_s)
    finally:
        col.close()


def nfcapd(
    datagrams: list[bytes], repeat: int, gap_s: float, tmp: Path, min_cpu: float, max_wall_s: float
) -> tuple:
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    d = tmp / "nfcapd"
    d.mkdir()
    proc = subprocess.Popen(
        ["nfcapd", "-p", str(port), "-b", "127.0.0.1", "-w", str(d), "-t", "3600", "-B", str(1 << 24)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)

    def passes(n: int) -> tuple[int, float]:
        c0 = _cpu_of(proc.pid)
        _send(datagrams, port, n, gap_s)
        time.sleep(1.0)
        return 0, _cpu_of(proc.pid) - c0  # records: counted from its file once it has stopped

    try:
        _, cpu, npass, reached = until_cpu(passes, repeat, min_cpu, max_wall_s)
    finally:
        proc.terminate()
        proc.wait(30)
    files = sorted(p for p in d.iterdir() if p.name.startswith("nfcapd."))
    flows = 0
    if files:
        out = subprocess.run(
            ["nfdump", "-I", "-r", str(files[-1])], capture_output=True, text=True, check=True
        ).stdout
        flows = int(next(line.split(":")[1] for line in out.splitlines() if line.startswith("Flows:")))
    return flows, cpu, npass, reached


def _rate(n: int, cpu: float) -> int | None:
    return round(n / cpu) if cpu > 0 else None


def _fmt(v: int | None) -> str:
    return "n/a (no CPU measured)" if v is None else f"{v:,}"


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser()
    ap.add_argument("--packets", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=10, help="passes of the export in each first round")
    ap.add_argument("--gap-us", type=float, default=20.0, help="pause between datagrams sent over UDP")
    ap.add_argument("--min-cpu-s", type=float, default=1.0, help="CPU each collector's measure must reach")
    ap.add_argument("--max-wall-s", type=float, default=600.0, help="per collector: stop short after this")
    a = ap.parse_args(argv)
    m = machine()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        datagrams = export(a.packets, tmp)
        per_pass = sum(1 for _ in datagrams)
        col = FlowCollector(buffer_bytes=1 << 26)
        col.feed(datagrams)
        one = col.decode().n
        lim = (a.min_cpu_s, a.max_wall_s)
        mem_n, mem_cpu, mem_p, mem_ok = lowwater_memory(datagrams, a.repeat, *lim)
        sock_n, sock_cpu, sock_p, sock_ok = lowwater_socket(datagrams, a.repeat, a.gap_us / 1e6, *lim)
        nf_n, nf_cpu, nf_p, nf_ok = nfcapd(datagrams, a.repeat, a.gap_us / 1e6, tmp, *lim)
    counted = mem_n == one * mem_p and sock_n == one * sock_p and nf_n == one * nf_p
    enough = mem_ok and sock_ok and nf_ok
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
        "records_per_s": _rate(mem_n, mem_cpu),
        "lowwater_memory": {"records": mem_n, "passes": mem_p, "cpu_s": round(mem_cpu, 3)},
        "lowwater_socket": {
            "records": sock_n,
            "passes": sock_p,
            "cpu_s": round(sock_cpu, 3),
            "records_per_cpu_s": _rate(sock_n, sock_cpu),
        },
        "nfcapd": {
            "records": nf_n,
            "passes": nf_p,
            "cpu_s": round(nf_cpu, 3),
            "records_per_cpu_s": _rate(nf_n, nf_cpu),
        },
        "all_records_counted": counted,
        "every_cpu_at_least_min": enough,
    }
    sock_r, nf_r = res["lowwater_socket"]["records_per_cpu_s"], res["nfcapd"]["records_per_cpu_s"]
    res["vs_nfcapd"] = round(sock_r / nf_r, 2) if counted and enough and sock_r and nf_r else None
    print(f"machine: {m['cpu']} ({m['cores']} cores)")
    print(
        f"export: {one} records in {per_pass} datagrams; passes: memory {mem_p}, socket {sock_p}, nfcapd {nf_p}"
    )
    print(
        f"lowwater decode+aggregate (memory): {_fmt(res['records_per_s'])} records/s per core ({mem_cpu:.2f} CPU-s)"
    )
    print(f"lowwater via UDP socket: {_fmt(sock_r)} records per CPU-s ({sock_cpu:.2f} CPU-s)")
    print(f"nfcapd via UDP socket:   {_fmt(nf_r)} records per CPU-s ({nf_cpu:.2f} CPU-s)")
    print(f"vs_nfcapd (socket paths, per CPU-s): {res['vs_nfcapd']}; every record counted: {counted}")
    if not enough:
        print(
            f"a collector's measure stayed under {a.min_cpu_s} CPU-s within {a.max_wall_s} s: no vs_nfcapd",
            file=sys.stderr,
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
