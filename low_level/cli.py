"""``lowwater-agent``: the capture host's command line (packets or flows), settings and life cycle.

Settings come from flags, ``LOWWATER_AGENT_*`` environment variables and an optional settings file
(:class:`low_level.settings.AgentSettings`; precedence in :mod:`contract.settings`). The loop itself is
``low_level.host.loop``; the packet agent ``low_level.host.agent``, the flow collector
``low_level.flows.agent``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from contract import query as Q
from contract.settings import role_parser
from low_level.host.agent import Agent
from low_level.host.loop import HostLoop

log = logging.getLogger("lowwater.agent")


def latent_option(spec: dict[str, Any]) -> bool:
    """Take the agent's ``timestamps`` option out of a source spec: ``latent`` (the agent stamps records
    when it reads them: on-demand punctuation paper section 5) or ``source`` (the default)."""
    how = spec.pop("timestamps", "source")
    if how not in ("source", "latent"):
        raise ValueError(f"timestamps={how!r}: use timestamps=latent or timestamps=source")
    return how == "latent"


def parse_source(text: str) -> dict[str, Any]:
    """'generator[:groups=N,rate=R]', 'pcap:PATH[,loop][,paced]' or 'afpacket:IF1+IF2[,promisc][,blocks=N]' -> spec.

    ``timestamps=latent`` (generator) or the flag ``latent`` (pcap, afpacket): the agent stamps each packet
    when it reads it, ignoring the source's time (:func:`latent_option`)."""
    kind, _, rest = text.partition(":")
    if kind == "generator":
        spec: dict[str, Any] = {"type": "generator"}
        for item in filter(None, rest.split(",")):
            k, _, v = item.partition("=")
            try:
                spec[k] = float(v) if "." in v else int(v)
            except ValueError:
                spec[k] = v  # e.g. clock=wall
        spec.setdefault("clock", "wall")
        return spec
    if kind == "pcap":
        path, *flags = rest.split(",")
        if not path:
            raise ValueError("pcap source needs a path: pcap:/path/file.pcap[,loop][,paced]")
        if not os.access(path, os.R_OK) or os.path.isdir(path):  # say so now, not after compiling the kernel
            raise ValueError(f"capture file {path!r} does not exist or cannot be read")
        return {
            "type": "pcap",
            "path": path,
            "loop": "loop" in flags,
            "mode": "paced" if "paced" in flags or "loop" in flags else "fast",
            "rebase_to_now": "loop" in flags,
            **({"timestamps": "latent"} if "latent" in flags else {}),
        }
    if kind == "afpacket":
        ifaces, *flags = rest.split(",")
        if not ifaces:
            raise ValueError("afpacket source needs interfaces: afpacket:eth0[+eth1][,promisc]")
        spec = {"type": "afpacket", "interfaces": ifaces.split("+"), "promiscuous": "promisc" in flags}
        if "latent" in flags:
            spec["timestamps"] = "latent"
        for item in (f for f in flags if f not in ("promisc", "latent")):
            k, _, v = item.partition("=")
            if k != "blocks" or not v.isdigit() or int(v) < 1:
                raise ValueError(
                    f"afpacket option {item!r}: use promisc or blocks=N (kernel ring blocks of 1 MiB)"
                )
            spec["block_count"] = int(v)
        return spec
    if kind == "flows":  # NetFlow v5/v9/IPFIX collector (low_level.flows.agent)
        from low_level.flows.agent import parse_flow_source

        return parse_flow_source(rest)
    raise ValueError(f"unknown source {text!r}: use generator, pcap:PATH, afpacket:IFACE or flows:HOST:PORT")


def parse_args(argv: list[str] | None = None) -> tuple[dict[str, Any], str | None]:
    """The flags the user gave (as settings fields) and the settings file, if any."""
    ap = role_parser("lowwater-agent", "lowwater capture-host agent", "AGENT")
    ap.add_argument(
        "--source",
        help="generator[:k=v,...] | pcap:PATH[,loop][,paced] | afpacket:IF[+IF][,promisc][,blocks=N]",
    )
    ap.add_argument("--host-id", help="this capture host's id (default: the host name)")
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default 127.0.0.1:9092)")
    ap.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (default 9101; 0 = off)")
    ap.add_argument("--ring-slots", type=int)
    ap.add_argument("--duration", type=float, help="stop after this many seconds")
    ap.add_argument(
        "--linger",
        action="store_true",
        default=None,
        help="keep running (heartbeats) after a finite source ends",
    )
    ap.add_argument(
        "--kafka-security",
        metavar="JSON",
        help="the Kafka security block (protocol, sasl_mechanism, username, password, ca_file, cert_file, "
        "key_file, check_hostname); see deploy/SECURITY.md",
    )
    ap.add_argument(
        "--control-topic",
        help="answer punctuation requests of the high level on this topic (e.g. lowwater.control)",
    )
    ap.add_argument(
        "--summary",
        metavar="FILE",
        help="write what the agent saw (packets, drops, matches per query) to FILE as JSON at exit",
    )
    ap.add_argument(
        "--workers",
        type=int,
        help="worker processes on this host (AF_PACKET fanout or a replay split "
        "by flow; each punctuates as host H/wI); default: half the cores for afpacket, else 1",
    )
    ap.add_argument(
        "--fanout", choices=("hash", "cpu"), help="AF_PACKET fanout mode of the workers (default hash)"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # INDEX/COUNT/GROUP, set by the supervisor
    a = ap.parse_args(argv)
    flags = {k: v for k, v in vars(a).items() if v is not None and k not in ("settings", "kafka_security")}
    if a.kafka_security is not None:
        import json

        try:
            flags["kafka_security"] = json.loads(a.kafka_security)
        except ValueError as exc:
            raise SystemExit(f"lowwater-agent: --kafka-security is not JSON: {exc}") from None
    return flags, a.settings


def main(argv: list[str] | None = None) -> None:
    from contract.settings import SettingsError, load
    from low_level.settings import AgentSettings

    flags, settings_file = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        s = load(AgentSettings, flags, settings_file)
        cfg = Q.load(s.config)
    except (SettingsError, Q.ConfigError) as exc:
        raise SystemExit(f"lowwater-agent: {exc}") from None
    named = [q for q in cfg.queries if not s.queries or q.name in s.queries]
    named_selects = [q for q in cfg.selects if not s.queries or q.name in s.queries]
    named_rows = [q for q in cfg.rows if not s.queries or q.name in s.queries]
    if not named and not named_selects and not named_rows:
        raise SystemExit(f"lowwater-agent: no query named {s.queries} in {s.config}")
    from low_level.capture import workers as W

    worker = W.parse_worker(s.worker) if s.worker else None
    nworkers = s.workers or W.default_workers(s.source)
    capture_host = s.host_id.rpartition("/w")[0] if worker else s.host_id
    # a query's `sources` name the hosts that run it; a worker H/wI runs what H runs (and what H/wI does)
    hosts = {s.host_id, capture_host}
    if nworkers > 1 and not worker:
        hosts |= {W.worker_host_id(s.host_id, i) for i in range(nworkers)}
    queries = [q for q in named if any(q.runs_on(h) for h in hosts)]
    selects = [q for q in named_selects if any(q.runs_on(h) for h in hosts)]
    rows = [q for q in named_rows if any(q.runs_on(h) for h in hosts)]
    for q in named:
        if q not in queries:
            log.info(
                "query %s does not run on host %s (sources: %s)", q.name, s.host_id, ", ".join(q.sources)
            )
    if not queries and not selects and not rows:
        raise SystemExit(
            f"lowwater-agent: host {s.host_id!r} matches the sources of none of the queries in {s.config}"
        )
    if nworkers > 1 and worker is None:
        try:
            parse_source(s.source)
        except ValueError as exc:
            raise SystemExit(f"lowwater-agent: cannot open source {s.source!r}: {exc}") from None
        raise SystemExit(
            W.supervise(
                list(sys.argv[1:] if argv is None else argv),
                s.host_id,
                nworkers,
                s.source,
                s.metrics_port,
                s.summary,
            )
        )
    opts: dict[str, Any] = {"producer_config": s.kafka_security.kafka_python()}
    control = None
    if s.control_topic:
        from low_level.host.ondemand import RequestListener

        control = RequestListener(  # aggregates, and selects a join reads (asked by a blocked join)
            s.host_id,
            [*queries, *selects],
            s.bootstrap,
            topic=s.control_topic,
            consumer_config=opts["producer_config"],
        ).start()
    try:
        spec = parse_source(s.source)
        latent = latent_option(spec)
        if spec["type"] == "flows":
            from low_level.flows.agent import FlowAgent

            if worker:
                raise SystemExit("lowwater-agent: a flow collector runs as one process (--workers 1)")

            if selects or rows:
                raise SystemExit(
                    "lowwater-agent: select and row queries need packets; a flow source has none "
                    f"({', '.join(x.name for x in [*selects, *rows])})"
                )
            agent: HostLoop = FlowAgent(
                queries, spec, s.host_id, s.bootstrap, emitter_opts=opts, networks=cfg.networks
            )
        else:
            packets = Agent(
                queries,
                None if worker else spec,
                s.host_id,
                s.bootstrap,
                ring_slots=s.ring_slots,
                emitter_opts=opts,
                control=control,
                selects=selects,
                networks=cfg.networks,
                latent_timestamps=latent,
                rows=rows,
            )
            if worker:  # a fanout member (live) or a flow share (replay): low_level/capture/fanout.py
                from low_level.capture.fanout import worker_source

                packets.source = worker_source(spec, packets.ring, *worker, fanout=s.fanout)
                packets.workers = int(worker[1])  # the high level waits for every worker of an expected host
            agent = packets
    except Q.ConfigError as exc:  # a bad networks file: file, line and reason
        raise SystemExit(f"lowwater-agent: {exc}") from None
    except (OSError, ValueError) as exc:  # a missing capture file, an unknown interface, a bad source spec
        raise SystemExit(f"lowwater-agent: cannot open source {s.source!r}: {exc}") from None
    if s.metrics_port:
        from low_level.host.metrics import serve_metrics

        serve_metrics(agent, s.metrics_port)
    agent.watch_signals()
    log.info(
        "host %s: %d queries, %d select queries, %d row queries, source %s, Kafka %s",
        s.host_id,
        len(queries),
        len(selects),
        len(rows),
        s.source,
        s.bootstrap,
    )
    agent.run(s.duration, exit_at_end=not s.linger)
    if s.summary:
        import json
        from pathlib import Path

        Path(s.summary).write_text(json.dumps(agent.summary(), indent=1))


if __name__ == "__main__":
    main()
