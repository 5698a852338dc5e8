"""Live capture: the highest rate each capturer takes with <= 0.1 % loss, lowwater vs pmacctd.

Root only. A network namespace of its own holds a veth pair (``va`` -> ``vb``, IPv6 off, nothing
else) and everything of the run: ``tcpreplay`` replays a pcap into ``va`` at a ladder of rates
(``--pps``; ``topspeed`` at the top, optionally with several tcpreplay processes at once), and the
capturer under test reads ``vb``:

* lowwater: ``lowwater-agent --source afpacket:vb,promisc`` with 1 and 2 workers (AF_PACKET fanout),
  the OOP paper's Q4 (count per (src, dst) per minute) into a Kafka broker started for the run
  inside the same namespace, so the agent pays its whole path;
* pmacctd (Debian 1.7.7, the peer of ``bench_peers.py``): ``pcap_interface: vb``, the print plugin
  with ``aggregate: src_host, dst_host`` (the same query), over ZeroMQ like in ``bench_peers.py``; with
  libpcap's default kernel buffer (2 MiB) and with ``pcap_buffer_size`` 64 MiB, the size of lowwater's
  default AF_PACKET ring (``--tools ...,pmacctd:64``); the better of the two is the peer's figure.

Each (capturer, rate) is one fresh capturer process: start, wait until it captures, replay for
``--seconds``, let it drain, stop it gracefully and read what it counted. Loss = 1 - counted / sent,
where sent is tcpreplay's "Successful packets" and counted is the packets the capturer aggregated
(lowwater: the query's ``matched`` summed over workers, from ``--summary``; pmacctd: the PACKETS of its
rows). Kernel drops are read from the capture socket, never inferred: PACKET_STATISTICS of each
worker's socket (``kernel_drops`` in the agent's summary) and pmacctd's own ``pcap_stats``
(``dropped_packets`` in its exit log line); the veth's rx drops (``ip -s link``) are reported too.
A capturer's no-drop rate is the highest achieved send rate (tcpreplay's own figure) at which its
loss was <= 0.1 %. When both capturers are lossless at tcpreplay's top speed, the sender is the
ceiling: the JSON says so (``sender_saturated``) and the ratio is then only a lower bound for the
faster one.

The frames (``--frame-bytes``, 64 by default) are built once with explicit
``Ether(src=02:00:00:cc:00:02, dst=02:00:00:cc:00:99)``: the destination is not the capture end's
address, so its stack discards them and nothing answers. The namespace is deleted at the end, also
on failure.

    sudo .venv/bin/python -m benchmarks.bench_live_capture [--pps 25000,50000,75000,100000,150000,200000,300000]
        [--seconds 4] [--senders 2,4] [--groups 65536]

Writes ``benchmarks/results/live_capture.json`` and ``live_capture.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from local_stack.kafka_broker import free_port
from lowwater_testing.agent import metrics_text
from lowwater_testing.queries import config, q4

REPO = Path(__file__).resolve().parents[1]
TMP = harness.RESULTS / "tmp"
WARMUP = 2000  # frames sent before each measured replay, outside the query (10.99/16): the capturer runs
LOSS_OK = 0.001  # <= 0.1 % loss counts as no-drop
SRC_MAC, DST_MAC = "02:00:00:cc:00:02", "02:00:00:cc:00:99"


def q4_yaml(table: int) -> str:
    """The OOP paper's Q4 on the benchmark's destination net, into its own topic."""
    return config(
        q4(
            "q4",
            filter="dst_ip in [10.78.0.0/16]",
            table=table,
            flush={"policy": "lazy", "m": 2},
            topic="lowwater.livecap.q4",
            partitions=2,
        )
    ).text


# ---------------------------------------------------------------------------------------------------
# traffic


def build_pcap(path: Path, n: int, groups: int, frame_bytes: int, dst_net: int = 78) -> None:
    """n TCP/IPv4 frames over ``groups`` (10.77.x.y -> 10.<dst_net>.x.y) pairs, explicit Ether src/dst."""
    from scapy.all import IP, TCP, Ether, Raw

    pad = max(0, frame_bytes - 54)
    tmpl = bytes(
        Ether(src=SRC_MAC, dst=DST_MAC)
        / IP(src="10.77.0.0", dst=f"10.{dst_net}.0.0", ttl=64)
        / TCP(sport=40000, dport=80, flags="A")
        / Raw(b"\0" * pad)
    )
    size = len(tmpl)
    rng = np.random.default_rng(7)
    g = rng.integers(0, groups, n)
    frames = np.tile(np.frombuffer(tmpl, dtype=np.uint8), (n, 1))
    frames[:, 28], frames[:, 29] = (g >> 8) & 0xFF, g & 0xFF  # src 10.77.hi.lo
    h = (g * 40503) % 65536
    frames[:, 32], frames[:, 33] = (h >> 8) & 0xFF, h & 0xFF  # dst 10.78.*.* (a bijection of g)
    frames[:, 24:26] = 0
    words = frames[:, 14:34].astype(np.uint32).reshape(n, 10, 2)
    s = (words[:, :, 0] << 8 | words[:, :, 1]).sum(axis=1)
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    c = ~s & 0xFFFF
    frames[:, 24], frames[:, 25] = c >> 8, c & 0xFF  # IPv4 header checksum
    rec = np.zeros((n, 16), dtype=np.uint8)
    hdr = rec.view("<u4").reshape(n, 4)
    t = np.arange(n, dtype=np.int64)
    hdr[:, 0], hdr[:, 1] = 1_700_000_000 + t // 1_000_000, t % 1_000_000
    hdr[:, 2] = hdr[:, 3] = size
    part = path.with_suffix(".part")
    with open(part, "wb") as fh:
        fh.write(
            np.array([0xA1B2C3D4], "<u4").tobytes()
            + np.array([2, 4], "<u2").tobytes()
            + np.array([0, 0, 65535, 1], "<u4").tobytes()
        )
        fh.write(np.concatenate([rec, frames], axis=1).tobytes())
    part.rename(path)


# ---------------------------------------------------------------------------------------------------
# the namespace (outer process)


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def make_namespace(ns: str) -> None:
    run("ip", "netns", "add", ns)
    run("ip", "-n", ns, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb")
    for dev in ("va", "vb"):
        run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv6.conf.{dev}.disable_ipv6=1")
    for dev in ("lo", "va", "vb"):
        run("ip", "-n", ns, "link", "set", dev, "up")


def outer(args: argparse.Namespace, argv: list[str]) -> int:
    if os.geteuid() != 0:
        raise SystemExit("bench_live_capture.py needs root (network namespace, veth pair, AF_PACKET)")
    for tool in ("ip", "tcpreplay", "pmacctd"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: ./lw setup installs it (APT_PACKAGES)")
    TMP.mkdir(parents=True, exist_ok=True)
    pcap = TMP / f"live-{args.packets}-{args.groups}-{args.frame_bytes}.pcap"
    if not pcap.exists():
        print(f"writing {pcap} ({args.packets:,} frames of {args.frame_bytes} bytes, {args.groups:,} groups)")
        build_pcap(pcap, args.packets, args.groups, args.frame_bytes)
    warm = TMP / f"live-warmup-{args.frame_bytes}.pcap"
    if not warm.exists():
        build_pcap(warm, WARMUP, 256, args.frame_bytes, dst_net=99)  # outside the query's filter
    ns = f"lwlc{uuid.uuid4().hex[:6]}"
    proc = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM still runs the clean-up below
    try:
        make_namespace(ns)
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                __file__,
                *argv,
                "--inside",
                ns,
                "--pcap",
                str(pcap),
                "--warm",
                str(warm),
            ],
            start_new_session=True,
        )
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        run("ip", "netns", "del", ns, check=False)


# ---------------------------------------------------------------------------------------------------
# inside the namespace


def veth_rx_dropped() -> int:
    out = run("ip", "-s", "-j", "link", "show", "vb").stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["dropped"])


def replay(pcap: Path, pps: int | None, seconds: float, packets: int, senders: int) -> dict:
    """tcpreplay into va; returns packets sent (its 'Successful packets'), the achieved rate and time."""
    per = (pps or 400_000) * seconds / senders
    loops = max(1, round(per / packets))
    rate = ["--topspeed"] if pps is None else ["--pps", str(max(1, pps // senders))]
    cmd = ["tcpreplay", "-q", "-i", "va", "-K", "--loop", str(loops), *rate, str(pcap)]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(senders)
    ]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    sent, rated, longest = 0, 0.0, 0.0
    for p, out in zip(procs, outs, strict=True):
        m = re.search(r"Successful packets:\s+(\d+)", out)
        r = re.search(r"Rated: .*?, ([\d.]+) pps", out)
        t = re.search(r"sent in ([\d.]+) seconds", out)
        if p.returncode != 0 or m is None or r is None or t is None:
            raise SystemExit(f"tcpreplay failed (exit {p.returncode}):\n{out[-2000:]}")
        sent += int(m.group(1))
        rated += float(r.group(1))  # its own rate, from its first packet (the preload is not in it)
        longest = max(longest, float(t.group(1)))
        if int(re.search(r"Failed packets:\s+(\d+)", out).group(1)):
            print(f"  tcpreplay reported failed packets:\n{out[-600:]}")
    # parallel senders: the packets over the longest sender's time (they overlap, not exactly)
    pps = rated if len(procs) == 1 else sent / longest
    return {"sent": sent, "seconds": longest, "pps": pps, "wall_with_start": wall}


def warm_up(pcap: Path) -> None:
    run("tcpreplay", "-q", "-i", "va", "--pps", "20000", str(pcap))


def processed(metrics: str) -> int:
    """lowwater_agent_packets_processed_total summed over the agent's workers."""
    return int(
        sum(
            float(v)
            for v in re.findall(r"^lowwater_agent_packets_processed_total\{[^}]*\} (\S+)$", metrics, re.M)
        )
    )


def scrape(port: int) -> str:
    return metrics_text(port, timeout=2)


class Lowwater:
    """One lowwater-agent process on vb with N workers; counts from its --summary."""

    def __init__(self, workers: int, cfg: Path, bootstrap: str, work: Path, warm: Path) -> None:
        self.workers, self.cfg, self.bootstrap, self.work, self.warm = workers, cfg, bootstrap, work, warm
        self.name = f"lowwater {workers} worker" + ("s" if workers > 1 else "")

    def start(self) -> None:
        self.summary = self.work / f"summary-{self.workers}.json"
        self.summary.unlink(missing_ok=True)
        self.port = free_port()
        self.log = self.work / f"agent-{self.workers}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "low_level.cli",
                "--config",
                str(self.cfg),
                "--source",
                "afpacket:vb,promisc",
                "--host-id",
                "livecap",
                "--bootstrap",
                self.bootstrap,
                "--metrics-port",
                str(self.port),
                "--workers",
                str(self.workers),
                "--summary",
                str(self.summary),
            ],
            cwd=REPO,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while "lowwater_agent_packets_processed_total" not in scrape(self.port):
            self._alive(deadline)
            time.sleep(0.5)
        # the kernel is compiled (or loaded) and runs once the warm-up frames were processed
        warm_up(self.warm)
        while processed(scrape(self.port)) < WARMUP:
            self._alive(deadline)
            time.sleep(0.2)

    def _alive(self, deadline: float) -> None:
        if self.proc.poll() is not None:
            raise SystemExit(f"{self.name} exited early:\n{self.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{self.name}: not processing after 300 s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        if self.proc.returncode != 0:
            raise SystemExit(f"{self.name} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        s = json.loads(self.summary.read_text())
        parts = list(s["workers"].values()) if "workers" in s else [s]
        return {
            "counted": sum(p["queries"]["q4"]["matched"] for p in parts),
            "kernel_drops": sum(int(p["source"].get("kernel_drops", 0)) for p in parts),
            "kernel_packets": sum(int(p["source"].get("kernel_packets", 0)) for p in parts),
            "ring_drops": sum(int(p["ring_drops"]) for p in parts),
            "per_worker_counted": [p["queries"]["q4"]["matched"] for p in parts],
        }


class Pmacctd:
    """One pmacctd on vb (print plugin, src_host x dst_host); counts from its rows, drops from pcap_stats."""

    def __init__(self, work: Path, groups: int, warm: Path, buffer_mib: int | None = None) -> None:
        self.work, self.warm, self.buffer_mib = work, warm, buffer_mib
        self.entries = next_prime(max(1024, groups // 5))
        # libpcap's default kernel buffer is 2 MiB; lowwater's AF_PACKET ring is 64 MiB by default
        self.name = "pmacctd" if buffer_mib is None else f"pmacctd {buffer_mib} MiB buffer"

    def start(self) -> None:
        self.out = self.work / "pmacct.csv"
        self.out.unlink(missing_ok=True)
        conf = self.work / "pmacct.conf"
        conf.write_text(f"""daemonize: false
pcap_interface: vb
{"" if self.buffer_mib is None else f"pcap_buffer_size: {self.buffer_mib << 20}"}
plugins: print[q4]
aggregate[q4]: src_host, dst_host
plugin_pipe_zmq[q4]: true
print_cache_entries[q4]: {self.entries}
print_refresh_time[q4]: 86400
print_output[q4]: csv
print_output_file[q4]: {self.out}
""")
        self.log = self.work / "pmacct.log"
        self.fh = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(["pmacctd", "-f", str(conf)], stdout=self.fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "cache entries=" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("pmacctd did not start:\n" + self.log.read_text()[-3000:])
            time.sleep(0.2)
        time.sleep(1.0)
        warm_up(self.warm)  # the same frames as lowwater's warm-up (outside the counted 10.78/16)
        time.sleep(0.5)

    def stop(self) -> dict:
        # SIGINT to the core: it hands the plugin its last, partly filled buffer, logs its pcap_stats
        # and stops the plugin, which purges its cache to the CSV file.
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(120)
        self.fh.close()
        text = self.log.read_text()
        m = re.findall(r"\[vb,\d+\] received_packets=(\d+) dropped_packets=(\d+)", text)
        if not m:
            raise SystemExit("pmacctd logged no pcap_stats:\n" + text[-3000:])
        counted = 0
        with open(self.out) as fh:
            head = fh.readline().strip().split(",")
            idst, ipk = head.index("DST_IP"), head.index("PACKETS")
            for line in fh:
                p = line.rstrip("\n").split(",")
                if p[idst].startswith("10.78."):
                    counted += int(p[ipk])
        lost = [x for x in text.splitlines() if "Missing data" in x or "Finished cache entries" in x]
        return {
            "counted": counted,
            "kernel_drops": int(m[-1][1]),
            "kernel_packets": int(m[-1][0]),
            "loss_messages": lost[:3],
        }


def next_prime(n: int) -> int:
    while n < 2 or any(n % f == 0 for f in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def inside(args: argparse.Namespace) -> int:
    from local_stack.kafka_broker import KafkaBroker

    pcap = Path(args.pcap)
    work = Path(tempfile.mkdtemp(prefix="lwlive-"))
    broker = None
    try:
        if any(t.startswith("lowwater") for t in args.tools):
            broker = KafkaBroker("livecap", port=0, state=work / "state", heap="384m").start()
        cfg = work / "q4.yaml"
        cfg.write_text(q4_yaml(1 << max(10, int(args.groups * 2 - 1).bit_length())))
        tools = []
        for t in args.tools:
            if t.startswith("pmacctd"):  # pmacctd, or pmacctd:MiB for its pcap_buffer_size
                mib = int(t.split(":")[1]) if ":" in t else None
                tools.append(Pmacctd(work, args.groups, Path(args.warm), mib))
            else:
                tools.append(
                    Lowwater(int(t.split(":")[1]), cfg, broker.bootstrap_servers, work, Path(args.warm))
                )
        ladder: list[tuple[int | None, int]] = [(p, 1) for p in args.pps] + [(None, 1)]
        ladder += [(None, k) for k in args.senders if k > 1]
        rows = []
        for tool in tools:
            print(f"\n[{tool.name}]")
            for pps, senders in ladder:
                tool.start()
                drop0 = veth_rx_dropped()
                rep = replay(pcap, pps, args.seconds, args.packets, senders)
                time.sleep(args.drain)
                got = tool.stop()
                loss = 1 - got["counted"] / rep["sent"]
                row = {
                    "tool": tool.name,
                    "asked_pps": pps or "topspeed",
                    "senders": senders,
                    "sent": rep["sent"],
                    "achieved_pps": round(rep["pps"]),
                    "achieved_mbps": round(rep["pps"] * args.frame_bytes * 8 / 1e6, 1),
                    "replay_s": round(rep["seconds"], 3),
                    "loss": loss,
                    "veth_rx_dropped": veth_rx_dropped() - drop0,
                    "load_avg": os.getloadavg()[0],
                    **got,
                }
                rows.append(row)
                print(
                    f"  {str(row['asked_pps']):>9} x{senders}: sent {rep['sent']:>9,} at {rep['pps']:>9,.0f} pkt/s, "
                    f"counted {got['counted']:>9,}, loss {100 * loss:6.3f} %, kernel drops {got['kernel_drops']:,}"
                    f" (load {row['load_avg']:.1f})",
                    flush=True,
                )
                if loss > args.stop_loss:
                    print(f"  loss above {100 * args.stop_loss:.0f} %: higher rates skipped")
                    break
        write_results(args, rows)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def nodrop(rows: list[dict], tool: str) -> dict | None:
    ok = [r for r in rows if r["tool"] == tool and r["loss"] <= LOSS_OK]
    return max(ok, key=lambda r: r["achieved_pps"]) if ok else None


def write_results(args: argparse.Namespace, rows: list[dict], keep_machine: dict | None = None) -> None:
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    best = {t: nodrop(rows, t) for t in tools}
    top_send = max(r["achieved_pps"] for r in rows)
    summary = {}
    for t in tools:
        b = best[t]
        lossy = [r for r in rows if r["tool"] == t and r["loss"] > LOSS_OK]
        low = min((r["achieved_pps"] for r in lossy), default=None)
        below = [
            r["achieved_pps"]
            for r in rows
            if r["tool"] == t and r["loss"] <= LOSS_OK and (low is None or r["achieved_pps"] < low)
        ]
        summary[t] = {
            "nodrop_pps": b["achieved_pps"] if b else 0,
            "nodrop_mbps": b["achieved_mbps"] if b else 0,
            # the highest lossless rate below the lowest lossy one (the load moves rates around)
            "nodrop_pps_below_first_loss": max(below, default=0),
            "lossless_at_every_rate": not lossy,
            "first_lossy": (
                {k: lossy[0][k] for k in ("achieved_pps", "loss", "kernel_drops")} if lossy else None
            ),
        }
    lw = [t for t in tools if t.startswith("lowwater")]
    lw_best = max((summary[t]["nodrop_pps"] for t in lw), default=0)
    pms = [t for t in tools if t.startswith("pmacctd")]  # the best pmacctd setting counts
    pm = max((summary[t]["nodrop_pps"] for t in pms), default=0)
    lw_low = max((summary[t]["nodrop_pps_below_first_loss"] for t in lw), default=0)
    pm_low = max((summary[t]["nodrop_pps_below_first_loss"] for t in pms), default=0)
    saturated = {t: summary[t]["lossless_at_every_rate"] for t in tools}
    result = {
        "benchmark": "live capture over a veth pair in a namespace of its own: tcpreplay -> capturer",
        "machine": keep_machine or machine(),
        "load_avg_start_end": [rows[0]["load_avg"], rows[-1]["load_avg"]],
        "frame_bytes": args.frame_bytes,
        "groups": args.groups,
        "pcap_packets": args.packets,
        "seconds_per_rate": args.seconds,
        "loss_threshold": LOSS_OK,
        "method": (
            "one fresh capturer per (tool, rate); loss = 1 - counted/sent (sent: tcpreplay's Successful "
            "packets; counted: lowwater's matched over workers, pmacctd's PACKETS of its rows); kernel drops "
            "from PACKET_STATISTICS (lowwater, per worker socket) and pcap_stats (pmacctd's exit log)"
        ),
        "rows": rows,
        "summary": summary,
        "lowwater_nodrop_pps": lw_best,
        "pmacctd_nodrop_pps": pm,
        "lowwater_vs_pmacctd_nodrop_ratio": round(lw_best / pm, 3) if pm and lw_best else None,
        "lowwater_vs_pmacctd_below_first_loss_ratio": round(lw_low / pm_low, 3)
        if pm_low and lw_low
        else None,
        "sender_top_pps": top_send,
        "sender_saturated": all(saturated.values()),
        "lossless_at_sender_top": saturated,
    }
    if result["sender_saturated"]:
        result["note"] = (
            "every capturer was lossless up to tcpreplay's top speed: the sender is the ceiling, the "
            "ratio is not the capturers' (both ceilings are above the sender's)"
        )
    elif saturated.get(lw[0] if lw else "", False) or any(saturated.get(t) for t in lw):
        result["note"] = (
            "lowwater was lossless at every rate tcpreplay reached, pmacctd was not: lowwater's no-drop "
            "rate is the sender's top, so the ratio is a lower bound"
        )
    harness.write_results("live_capture.json", result, indent=1)
    chart(rows, harness.RESULTS / "live_capture.png")
    rates = ", ".join(f"{t} {summary[t]['nodrop_pps']:,} pkt/s" for t in tools)
    print(f"\nno-drop rates: {rates}")
    print(
        f"lowwater_vs_pmacctd_nodrop_ratio = {result['lowwater_vs_pmacctd_nodrop_ratio']}"
        f"{' (sender saturated)' if result['sender_saturated'] else ''}"
    )
    print(f"wrote {harness.RESULTS / 'live_capture.json'}")


def chart(rows: list[dict], path: Path) -> None:
    plt = harness.pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for t in dict.fromkeys(r["tool"] for r in rows):
        rs = sorted((r for r in rows if r["tool"] == t), key=lambda r: r["achieved_pps"])
        ax.plot(
            [r["achieved_pps"] / 1e3 for r in rs],
            [max(100 * r["loss"], 1e-3) for r in rs],
            marker="o",
            label=t,
        )
    ax.axhline(100 * LOSS_OK, color="grey", ls="--", lw=1, label="0.1 % loss")
    ax.set_yscale("log")
    ax.set_xlabel("achieved send rate (kpkt/s, tcpreplay)")
    ax.set_ylabel("loss % (0 plotted at 0.001)")
    ax.set_title("live capture over veth: loss vs rate")
    ax.legend(fontsize=8)
    harness.save_figure(fig, path)


def main() -> int:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--pps",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[25_000, 50_000, 75_000, 100_000, 150_000, 200_000, 300_000],
        help="rates asked of tcpreplay, then --topspeed",
    )
    ap.add_argument(
        "--senders",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2, 4],
        help="tcpreplay processes of the topspeed steps after the single one",
    )
    ap.add_argument("--seconds", type=float, default=4.0, help="replay time per rate")
    ap.add_argument("--drain", type=float, default=1.5, help="seconds between the replay's end and the stop")
    ap.add_argument("--packets", type=int, default=200_000, help="frames in the pcap (looped)")
    ap.add_argument("--groups", type=int, default=65_536)
    ap.add_argument("--frame-bytes", type=int, default=64)
    ap.add_argument(
        "--tools", type=lambda s: s.split(","), default=["lowwater:1", "lowwater:2", "pmacctd", "pmacctd:64"]
    )
    ap.add_argument("--stop-loss", type=float, default=0.05, help="stop a tool's ladder above this loss")
    ap.add_argument(
        "--rewrite", action="store_true", help="recompute the JSON and PNG from the last run's rows"
    )
    ap.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pcap", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rewrite:  # the figures again from the rows of the last run (same machine record)
        old = json.loads((harness.RESULTS / "live_capture.json").read_text())
        args.frame_bytes, args.groups, args.packets = old["frame_bytes"], old["groups"], old["pcap_packets"]
        args.seconds = old["seconds_per_rate"]
        write_results(args, old["rows"], keep_machine=old["machine"])
        return 0
    if args.inside:
        return inside(args)
    return outer(args, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
