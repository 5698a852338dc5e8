"""Flow collection throughput: IPFIX records decoded and aggregated per CPU-second, lowwater vs nfcapd.

One export, made once: softflowd exports a synthetic pcap as IPFIX (flows of several packets). The same
datagrams then go (1) through lowwater's decoder and weighted kernel in memory (the per-core work of
``flows:`` collection, no socket), (2) through lowwater over a UDP socket (receive + decode +
aggregate; CPU of the calls that received something, so the Python loop's idle polls are left out),
and (3) to ``nfcapd`` over UDP, whose whole CPU time (utime + stime, clock ticks) is read from /proc:
it blocks in recvfrom when idle. Rates are records per CPU-second of the collecting process, so the
sender's pace does not enter them; ``vs_nfcapd`` is given only when every collector counted every
record.

Run: ``.venv/bin/python -m benchmarks.bench_flows [--packets 300000] [--repeat 20]``.
"""

from __future__ import annotations

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


def lowwater_memory(datagrams: list[bytes], repeat: int) -> tuple[int, float]:
    q = Q.load_text(QUERY).queries
    tables = Tables.build(q, chunk=1 << 14)
    k = FlowKernel(tables)
    k.warm()
    col = FlowCollector(buffer_bytes=1 << 26)
    col.warm()
    col.feed(datagrams)  # templates first, outside the clock
    while col.pending:
        col.decode()
    records = 0
    cpu = 0.0
    for _ in range(repeat):
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


def lowwater_socket(datagrams: list[bytes], repeat: int, gap_s: float) -> tuple[int, float]:
    q = Q.load_text(QUERY).queries
    tables = Tables.build(q, chunk=1 << 14)
    k = FlowKernel(tables)
    k.warm()
    col = FlowCollector(buffer_bytes=1 << 26).open()
    col.warm()
    sender = multiprocessing.get_context("spawn").Process(
        target=_send, args=(datagrams, col.port, repeat, gap_s)
    )
    sender.start()
    records, idle, cpu = 0, 0, 0.0
    while idle < 2000:
        t0 = (
            time.process_time()
        )  # CPU of receiving and folding only: an idle poll is the loop's, not the work's
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
    col.close()
    return records, cpu


def nfcapd(datagrams: list[bytes], repeat: int, gap_s: float, tmp: Path) -> tuple[int, float]:
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
    c0 = _cpu_of(proc.pid)
    _send(datagrams, port, repeat, gap_s)
    time.sleep(1.0)
    c1 = _cpu_of(proc.pid)
    proc.terminate()
    proc.wait(30)
    files = sorted(p for p in d.iterdir() if p.name.startswith("nfcapd."))
    out = subprocess.run(
        ["nfdump", "-I", "-r", str(files[-1])], capture_output=True, text=True, check=True
    ).stdout
    flows = int(next(line.split(":")[1] for line in out.splitlines() if line.startswith("Flows:")))
    return flows, c1 - c0


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser()
    ap.add_argument("--packets", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--gap-us", type=float, default=20.0, help="pause between datagrams sent over UDP")
    a = ap.parse_args(argv)
    m = machine()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        datagrams = export(a.packets, tmp)
        per_pass = sum(1 for _ in datagrams)
        col = FlowCollector(buffer_bytes=1 << 26)
        col.feed(datagrams)
        one = col.decode().n
        mem_n, mem_cpu = lowwater_memory(datagrams, a.repeat)
        sock_n, sock_cpu = lowwater_socket(datagrams, a.repeat, a.gap_us / 1e6)
        nf_n, nf_cpu = nfcapd(datagrams, a.repeat, a.gap_us / 1e6, tmp)
    want = one * a.repeat
    ok = mem_n == want and sock_n == want and nf_n == want
    res = {
        "machine": m,
        "export": {
            "pcap_packets": a.packets,
            "datagrams": per_pass,
            "records": one,
            "repeat": a.repeat,
            "exporter": "softflowd 1.1.0 -v 10 -A milli",
        },
        "records_per_s": round(mem_n / mem_cpu) if mem_cpu else None,
        "lowwater_memory": {"records": mem_n, "cpu_s": round(mem_cpu, 3)},
        "lowwater_socket": {
            "records": sock_n,
            "cpu_s": round(sock_cpu, 3),
            "records_per_cpu_s": round(sock_n / sock_cpu) if sock_cpu else None,
        },
        "nfcapd": {
            "records": nf_n,
            "cpu_s": round(nf_cpu, 3),
            "records_per_cpu_s": round(nf_n / nf_cpu) if nf_cpu else None,
        },
        "all_records_counted": ok,
    }
    res["vs_nfcapd"] = (
        round(res["lowwater_socket"]["records_per_cpu_s"] / res["nfcapd"]["records_per_cpu_s"], 2)
        if ok and nf_cpu and sock_cpu
        else None
    )
    print(f"machine: {m['cpu']} ({m['cores']} cores)")
    print(f"export: {one} records in {per_pass} datagrams, x{a.repeat}")
    print(f"lowwater decode+aggregate (memory): {res['records_per_s']:,} records/s per core")
    print(f"lowwater via UDP socket: {res['lowwater_socket']['records_per_cpu_s']:,} records per CPU-s")
    print(f"nfcapd via UDP socket:   {res['nfcapd']['records_per_cpu_s']:,} records per CPU-s")
    print(f"vs_nfcapd (socket paths, per CPU-s): {res['vs_nfcapd']}; every record counted: {ok}")
    if not ok:
        print(
            f"record counts differ (want {want}): memory {mem_n}, socket {sock_n}, nfcapd {nf_n}",
            file=sys.stderr,
        )
    harness.RESULTS.mkdir(exist_ok=True)
    harness.write_results("flows.json", res, indent=1)


if __name__ == "__main__":
    main()
