"""Render benchmarks/results/*.json into one results page, benchmarks/results/README.md.

Every figure on the page is read from a results file written by a benchmark run; nothing is typed
in by hand. Run it after any benchmark: ``.venv/bin/python -m benchmarks.report``.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def machine(d: dict) -> str:
    m = d.get("machine") or {}
    cpu = m.get("cpu", "?") + (f" ({m['cpu_id']})" if m.get("cpu_id") else "")
    return f"_{cpu}, {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB; run {m.get('date', '?')}_"


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def grid(rows: list[dict], spec: str) -> str:
    """A table from one spec, ``"header={field:format} | ..."`` (format_map on each row), so that a table's
    columns read as one line each of header and format instead of a header list and a cell list."""
    cols = [c.split("=", 1) for c in spec.split(" | ")]
    return table([h for h, _ in cols], [[f.format_map(r) for _, f in cols] for r in rows])


def img(name: str) -> str:
    return f"\n![{name}]({name}.png)\n" if (RESULTS / f"{name}.png").exists() else ""


# One sentence per reproduced figure: the paper's shape against ours, numbers read from the results.
def _skew_iop_sentence(d: dict) -> str:
    r = d["oop_vs_iop_state_at_40s"]
    hi, lo = r.get("110000"), r.get("4000")
    out = "**Against the paper:** Fig. 1 has OOP at ~30 % of IOP's memory at 40 s skew, growing slowly."
    if hi is not None:
        out += (
            f" Here {hi:.2f} at the paper's 110,000 pkt/s: the shape matches and is steeper, since the ordered "
            "union buffers every packet tuple of the early host while OOP's state is bounded by groups x open panes"
        )
    if lo is not None:
        out += (
            f"; {lo:.2f} at 4,000 pkt/s (`bench_skew.py`'s rate): differs, with ~0.6 packets per group per "
            "10-s window aggregation has nothing to compress, so both grow with skew alike"
        )
    return out + "."


def _panes_sentence(rows: list[dict]) -> str:
    r = {
        (x["panes_per_window"], x["records_per_group_per_pane"]): x["time_ratio_paned_vs_unpaned"]
        for x in rows
    }
    k5 = r.get((5, 20))
    return (
        "**Against the paper:** Fig. 6-15 has panes at ~30 % of the unpaned time at 20 tuples per pane and 5 panes "
        f"per window. Here {k5:.2f} at 20 records per group per pane and 5 panes per window: matches (panes win more "
        "as panes per window and records per pane grow; at 1 record per group per pane and 2 panes they are even), "
        "with equal state, as the dissertation expects."
        if k5 is not None
        else ""
    )


def _union_sentence(rows: list[dict]) -> str:
    v = {x["variant"]: x for x in rows}
    a, c, cr, d = (
        v.get(k) for k in ("A no punctuation", "C on demand", "C' on request", "D latent timestamps")
    )
    if not (a and c and cr and d):
        return ""
    return (
        f"**Against the paper:** Fig. 7/8 have A >> B (falling with rate) > C ~ D. Here A {a['latency_mean_s']:.1f} s, "
        f"B falls with the heartbeat rate, but C {c['latency_mean_s']:.2f} s = D {d['latency_mean_s']:.2f} s: differs "
        "in that C and D do not reach the ideal, because the floor is the busy dense host (lazy flush keeps its mark a "
        "pane behind, and a busy host never idles, so only its 1-s timer punctuates); asking the blocking host (C') "
        f"gives {cr['latency_mean_s']:.3f} s, and a sweep at every 100-ms heartbeat removes the floor too."
    )


def _n3_sentence(rows: list[dict]) -> str:
    big = max(x["delay_s"] for x in rows)
    v = {x["variant"]: x for x in rows if x["delay_s"] == big}
    out = (
        f"**Against the paper:** Fig. 13 (N3) has OOP memory about flat as C's delay grows. Here, at {big} s delay, "
        f"on demand holds a peak of {v['on demand']['rows_peak']:,} rows and closes at "
        f"{v['on demand']['latency_mean_s']:.1f} s, a watermark of delay = skew {v['watermark = delay']['rows_peak']:,} "
        f"rows at {v['watermark = delay']['latency_mean_s']:.1f} s: state grows mildly with the delay (bounded by "
        "groups x open panes), matching; a 2-s watermark stays small only by dropping C's late packets."
    )
    if "IOP" in v:
        small = min(x["delay_s"] for x in rows)
        i0 = next(x for x in rows if x["delay_s"] == small and x["variant"] == "IOP")
        out += (
            f" The in-order plan (IOP) grows steeply, {i0['rows_peak']:,} -> {v['IOP']['rows_peak']:,} peak rows "
            f"({small} -> {big} s): it buffers every dense-host packet of the delay."
        )
    return out


def _band_join_sentence(d: dict) -> str:
    rows = d["rows"]
    hi = max(r["band_s"] for r in rows)
    v = {r["variant"]: r for r in rows if r["band_s"] == hi}
    return (
        f"**Against the paper:** Fig. 11 / Fig. 7-6 have OA far below OPOB in memory, latency and time, Fig. 7-7 OA "
        f"slightly below OPIB in memory. Here at n = {hi} s OA holds {v['OA']['peak_rows']:,} rows, OPOB "
        f"{v['OPOB']['peak_rows']:,} (its output buffer grows with n squared), OPIB {v['OPIB']['peak_rows']:,} "
        "(M2 tuples wait for the M1 front, n behind): memory matches. Latency is equal "
        f"({v['OA']['latency_median_s']} s, the band itself: a window's last pair can come until M2 passes its end "
        "+ n), so the paper's latency gain does not appear: here the ordered release is exactly as early as the "
        "join's own mark. CPU time is close (see the table)."
    )


def _late_join_sentence(d: dict) -> str:
    g = d["method"].get("oop_vs_iop_growth_per_s_delay")
    return (
        "**Against the paper:** Fig. 12 / Fig. 8-10 have OOP memory growing more slowly with the delay than IOP's. "
        f"Here OOP grows {g} times as fast as IOP per second of delay: it holds M1 tuples for C, IOP holds them "
        "and M2's too (in the merge): matches."
    )


def _disorder_sentence(rows: list[dict]) -> str:
    p = {(x["disorder"], x["plan"]): x for x in rows if x["slack_ms"] is None}
    b, bh, bd = (
        p.get(("band", "punctuation")),
        p.get(("block", "punctuation")),
        p.get(("block", "punctuation, hold m")),
    )
    if not (b and bh and bd):
        return ""
    return (
        "**Against the paper:** Figs. 6-11/6-12 have punctuation better than any slack in both latency and accuracy. "
        f"Here punctuation is exact under band disorder but later ({b['latency_mean_s']:.2f} s) than the smallest exact "
        "slack, and under block-sorted disorder today's rule (mark = oldest pane in the table) drops "
        f"{bh['late_pct']:.1f} % of the packets as late (at the start, before the table holds an older pane), "
        f"`hold_panes = m` none, at {bd['latency_mean_s']:.1f} s: "
        "differs, because the paper's punctuation comes from a source that knows its disorder, while a lowwater host "
        "infers its mark from its table, a pane-grained, m-pane-late bound."
    )


# the seeds' join experiments: results file, section title, table spec, the sentence against the paper
JOIN_SWEEPS = (
    (
        "band_join",
        "## Band join, band size swept: OA vs OPOB vs OPIB (OOP N1 / Fig. 11, dissertation Figs. 7-6, 7-7)",
        "band s={band_s} | variant={variant} | peak rows={peak_rows:,} | peak bytes={peak_bytes:,} | "
        "median latency s={latency_median_s} | pairs={pairs:,} | CPU s={cpu_s} | exact={exact}",
        _band_join_sentence,
    ),
    (
        "late_join",
        "## Window join with one late input: OOP vs IOP (OOP N2 / Fig. 12, dissertation Fig. 8-10)",
        "C delay s={delay_s} | variant={variant} | peak rows={peak_rows:,} | peak bytes={peak_bytes:,} | "
        "pairs={pairs:,} | late={late_rows} | CPU s={cpu_s} | exact={exact}",
        _late_join_sentence,
    ),
)


def _reliability(d: dict | None) -> list[str]:
    """The recovery section (bench_recovery): the three figures in a sentence, then one row per fault."""
    if d is None:
        return []
    events = grid(
        d["run"]["events"],
        "fault={fault} | at s={t_kill_s} | next window s={next_window_s} | recovery s={recovery_s} | what={what}",
    )
    figures = (
        f"{d['setup']}. **job_recovery_s = {d['job_recovery_s']}**, **broker_recovery_s = {d['broker_recovery_s']}** "
        "(from the kill until a window whose input was still arriving at the kill is whole in the store), "
        f"**rows_written_twice = {d['rows_written_twice']}**; every window exact: {d['exact']} "
        f"({d['run']['windows_checked']} windows against the oracle); steady close latency "
        f"{d['steady_close_latency_s']} s."
    )
    title = "## Central-tier recovery: the driver and a Kafka broker SIGKILLed mid-stream"
    return [title, machine(d), figures, events, img("reliability")]


def main() -> None:
    parts = [
        "# lowwater benchmark results",
        "Generated by `benchmarks/report.py` from the JSON files in this folder. Every benchmark is one "
        "command (`.venv/bin/python -m benchmarks.bench_<name>`); each states its machine. The machine is a "
        "shared 2-core VM, so absolute numbers drift; compare the ratios measured within one run.",
    ]
    if d := load("kernel"):
        parts += [
            "## Kernel throughput (Q4, one core)",
            machine(d),
            f"Q4 = count per (src_ip, dst_ip) per 1-minute window; {d['groups']:,} groups, table {d['table']:,}, "
            f"{d['packets']:,} frames of {d['snaplen']} B read from the capture ring. "
            f"**kernel_mpps = {d['kernel_mpps']}** (lazy flush, wall clock)"
            + (f"; {d['kernel_mpps_cpu']} by CPU time" if d.get("kernel_mpps_cpu") else "")
            + "."
            + (
                f" **kernel_vs_reference = {d['kernel_vs_reference']}** (slow flush "
                f"{d['kernel_vs_reference_slow']}): Q4 lazy / the simplest correct Q4 kernel, same run "
                f"(per round {d['kernel_vs_reference_per_round']}). **Three queries of default.yaml in one pass: "
                f"{d['three_queries_mpps']} Mpkt/s = {d['three_queries_vs_q4']} of Q4.**"
                if "kernel_vs_reference" in d
                else ""
            ),
            grid(
                [
                    {
                        **r,
                        "vs": r["mpps"] / d["kernel_mpps"],
                        "runs": ", ".join(str(x) for x in r.get("all_mpps", [])),
                    }
                    for r in d["rows"]
                ],
                "variant={variant} | Mpkt/s={mpps:.2f} | vs lazy={vs:.2f} | all runs={runs}",
            ),
        ]
    if d := load("flush_policies"):
        rows = d["rows"]
        parts += [
            "## Flush policies (OOP paper Fig. 9)",
            machine(d),
            f"Largest packet rate sustained without ring drops (ring of {d['ring_slots']:,} slots), "
            "trace-driven paced producer; method in the JSON and in `bench_flush.py`.",
            grid(
                [{**r, "mpps": r["sustained_pps"] / 1e6} for r in rows],
                "groups={groups:,} | table={table:,} | policy={policy} | sustained Mpkt/s={mpps:.2f} | "
                "worst chunk ms={worst_chunk_ms:.1f} | vs IOP={ratio_vs_iop:.2f}",
            ),
            img("flush_policies"),
        ]
    if d := load("pcap_to_kafka"):
        parts += [
            "## End to end on a capture host: pcap -> Kafka",
            machine(d),
            f"{d['packets']:,} packets, {d['groups']:,} groups, {d['query']}. "
            f"**e2e_mpps = {d['e2e_mpps']:.2f}**"
            + (
                f"; **pcap_to_kafka_vs_kernel = {d['pcap_to_kafka_vs_kernel']}** (per round "
                f"{d['pcap_to_kafka_vs_kernel_per_round']})"
                if "pcap_to_kafka_vs_kernel" in d
                else ""
            )
            + ".",
            table(
                ["variant", "seconds", "Mpkt/s"],
                [[r["variant"], f"{r['seconds']:.2f}", f"{r['mpps']:.2f}"] for r in d["rows"]],
            ),
        ]
    if d := load("stages"):
        parts += [
            "## Where time goes: each stage",
            machine(d),
            f"{d['packets']:,} packets -> {d['partials']:,} partial records.",
            grid(
                [{**r, "m": r["rate"] / 1e6} for r in d["rows"]],
                "stage={stage} | rate={m:.2f} M {unit}/s | ns per packet={ns_per_packet:.1f} | source={source}",
            ),
            img("stages"),
        ]
    if d := load("rollup"):
        parts += [
            "## High-level roll-up rate (Spark local[2])",
            machine(d),
            f"{d['records_total']:,} partial records from {d['hosts']} hosts, {d['groups']:,} groups, "
            f"{d['partitions']} partitions, through Kafka -> Spark -> Parquet. The running job sustains "
            f"**{d['spark_records_per_s']:,} records/s** with micro-batches of up to {d['batch_records']:,} "
            f"records; the same processor without Spark: {d['offline_records_per_s']:,} records/s. "
            f"{d['definition']}",
            grid(
                d.get("configs", []),
                "batch bound (records)={batch_records:,} | batches={batches} | first batch s (query start)={first_batch_seconds:.2f} | "
                "sustained records/s={sustained_records_per_s:,} | catch-up records/s={catchup_records_per_s:,} | CPU s={cpu_seconds:.1f}",
            ),
        ]
    if d := load("rollup_scale"):
        pts = d["points"]
        sts = [st for st in ("blob", "chunked") if all(st in pt for pt in pts)]
        parts += [
            "## High-level rate against open state (blob vs chunked state)",
            machine(d),
            f"One pane holds `open groups` distinct groups and stays open; then {d['sweep_records']:,} more "
            f"partials of those groups arrive in micro-batches of {d['sweep_batch_records']:,} records "
            f"({d['hosts']} hosts, {d['partitions']} partitions, {d['master']}); both layouts on the same topic "
            "in one run, each checked after (every group closes with every record). "
            + (
                f"**rate_ratio_5m_vs_100k = {d['rate_ratio_5m_vs_100k']}** (chunked; goal >= 0.7); blob "
                f"{d.get('blob_rate_ratio')}; chunked / blob at the largest point "
                f"{d.get('chunked_vs_blob_at_largest')}. "
                if "rate_ratio_5m_vs_100k" in d
                else ""
            )
            + d["definition"],
            table(
                [
                    "open groups",
                    *[f"{st} records/s" for st in sts],
                    *[f"{st} batches" for st in sts],
                    "checked",
                ],
                [
                    [
                        f"{pt['open_groups']:,}",
                        *[f"{pt[st]['records_per_s']:,}" for st in sts],
                        *[pt[st]["measured_batches"] for st in sts],
                        "yes" if all(pt[st].get("checked") for st in sts) else "no",
                    ]
                    for pt in pts
                ],
            ),
            img("rollup_scale"),
        ]
    if d := load("skew"):
        parts += [
            "## State and latency vs inter-host skew (OOP paper Fig. 1)",
            machine(d),
            grid(
                d["rows"],
                "skew s={skew_s} | variant={variant} | state rows (mean)={state_rows_mean:,.0f} | "
                "Spark state MiB={spark_state_mib_mean:.1f} | latency s={latency_mean_s:.0f} | packets missing %={packets_missing_pct:.1f}",
            ),
            img("skew"),
            (
                f"`iop` = the paper's baseline, an in-order merge of the packet tuples in front of the same roll-up "
                f"(its rows + buffered tuples). lowwater / IOP state payload by skew: "
                f"{ {k: round(v, 2) for k, v in d['oop_vs_iop_state_by_skew'].items()} }; at 40 s "
                f"**{d['oop_vs_iop_state_at_40s']:.2f}** (paper: ~0.3 at 110,000 pkt/s; see the next section for "
                "that rate)."
                if d.get("oop_vs_iop_state_at_40s") is not None
                else ""
            ),
        ]
    if d := load("skew_iop"):
        parts += [
            "## State vs skew against an in-order merge (OOP paper Fig. 1 / dissertation Fig. 8-8)",
            machine(d),
            "OOP = the real high-level processor over per-second partials; IOP = an order-preserving union of "
            "the packet tuples in front of the same roll-up (buffer of 48-B tuples). Peak state (MiB) and the "
            f"OOP/IOP ratio at 40 s skew: {json.dumps(d['oop_vs_iop_state_at_40s'])} (paper: ~0.3).",
            grid(
                d["rows"],
                "pkt/s per host={rate_pkt_per_s:,} | skew s={skew_s} | plan={variant} | agg rows (mean)={agg_rows_mean:,.0f} | "
                "buffer tuples (mean)={buffer_tuples_mean:,.0f} | state MiB (mean)={state_mib_mean:.1f} | peak MiB={state_mib_max:.1f} | "
                "latency s={latency_mean_s:.1f}",
            ),
            img("skew_iop"),
            _skew_iop_sentence(d),
        ]
    if d := load("panes"):
        rows = [r for r in d["rows"] if r["plan"] == "paned"]
        un = {(r["panes_per_window"], r["records_per_pane"]): r for r in d["rows"] if r["plan"] == "unpaned"}
        parts += [
            "## Panes vs no panes (dissertation Fig. 6-15)",
            machine(d),
            "CPU per pane of the paned roll-up (lowwater) and of per-window evaluation (WID without panes), "
            "same input, same windows (checked equal).",
            grid(
                [{**r, "un": un[(r["panes_per_window"], r["records_per_pane"])]} for r in rows],
                "panes per window={panes_per_window} | records per group per pane={records_per_group_per_pane:g} | "
                "paned ms={cpu_ms_per_pane:.2f} | unpaned ms={un[cpu_ms_per_pane]:.2f} | "
                "paned / unpaned={time_ratio_paned_vs_unpaned:.2f} | paned rows={rows_mean:,.0f} | unpaned rows={un[rows_mean]:,.0f}",
            ),
            img("panes"),
            _panes_sentence(rows),
        ]
    if d := load("union"):
        parts += [
            "## On-demand punctuation, the seed's four variants (on-demand paper Fig. 7 and 8)",
            machine(d),
            "Dense 50,000 pkt/s + sparse 0.05 pkt/s host, 1-s windows; virtual time on the real kernel, "
            "punctuation rule and processor (`benchmarks/hostsim.py`).",
            grid(
                [{**r, "wait_pct": 100 * r["wait_fraction"]} for r in d["rows"]],
                "variant={variant} | windows={windows} | mean latency s={latency_mean_s:.3f} | max s={latency_max_s:.3f} | "
                "idle-wait %={wait_pct:.1f} | peak rows={rows_peak:,} | punctuations/s={punctuations_per_s:.2f} | late={late_records}",
            ),
            img("union"),
            _union_sentence(d["rows"]),
        ]
    if d := load("n3"):
        parts += [
            "## Two dense hosts + one sparse delayed host, sliding count (OOP N3 / dissertation Fig. 8-11)",
            machine(d),
            grid(
                d["rows"],
                "C delay s={delay_s} | variant={variant} | mean latency s={latency_mean_s:.2f} | peak rows={rows_peak:,} | "
                "mean rows={rows_mean:,.0f} | punctuations/s={punctuations_per_s:.2f} | late records={late_records} | "
                "packets missing={packets_missing}",
            ),
            img("n3"),
            _n3_sentence(d["rows"]),
        ]
    for name, title, spec, sentence in JOIN_SWEEPS:
        if d := load(name):
            parts += [title, machine(d), grid(d["rows"], spec), img(name), sentence(d)]
    if d := load("disorder"):
        parts += [
            "## Disorder inside one stream (dissertation Fig. 6-11 and 6-12)",
            machine(d),
            grid(
                [
                    {**r, "slack": "-" if r["slack_ms"] is None else r["slack_ms"], "m": r["m"] or "-"}
                    for r in d["rows"]
                ],
                "disorder={disorder} | plan={plan} | slack ms={slack} | m={m} | mean latency s={latency_mean_s:.3f} | "
                "mean error %={mean_error_pct:.3f} | wrong results %={wrong_results_pct:.2f} | late packets={late_packets:,}",
            ),
            img("disorder"),
            _disorder_sentence(d["rows"]),
        ]
    if d := load("upstream"):
        parts += [
            "## Live results under overload (UpStream's experiment)",
            machine(d),
            f"Average staleness (s, the seed's Definitions 9-10) of one live consumer vs load factor; "
            f"{d['groups']} groups, {d['packets_per_s']} pkt/s, {d['seconds']} s of data; updates from the real "
            f"partition processor. **inplace_vs_fifo_staleness_at_lf4 = {d['inplace_vs_fifo_staleness_at_lf4']}** "
            f"(vs the window-aware FIFO {d['inplace_vs_fifo_final_staleness_at_lf4']}); "
            f"**linecutting_vs_inplace_staleness_skewed = {d['linecutting_vs_inplace_staleness_skewed']}** with "
            f"{100 * d['linecutting_throughput_loss_skewed']:.2f} % throughput loss (at LF 4).",
            grid(
                d["rows"],
                "keys={distribution} | LF={load_factor} | policy={policy} | staleness s={staleness_s:.3f} | delivered={delivered:,} | "
                "overwrites={overwrites:,} | skipped windows={skipped_windows} | max cells={max_cells}",
            ),
            img("upstream"),
        ]
    if d := load("on_demand"):
        parts += [
            "## On-demand punctuation, on request and periodic heartbeats (dense + sparse host, real agents)",
            machine(d),
            grid(
                [{**r, "rq": r.get("requests_per_s", 0)} for r in d["rows"]],
                "setting={setting} | windows={windows} | mean latency s={latency_mean_s:.2f} | p50 s={latency_p50_s:.2f} | "
                "max s={latency_max_s:.2f} | punctuations/s={punctuations_per_s:.1f} | requests/s={rq:.1f}",
            ),
            img("on_demand"),
        ]
    if d := load("peers"):
        parts += [
            "## Peers on the same pcap and query",
            machine(d),
            f"Counts agree across all tools: **{d.get('all_agree')}**.",
        ]
        for sh in d.get("shapes") or [{"pcap": d["pcap"], "rows": d["rows"], "lowwater_vs_pmacctd": None}]:
            p = sh["pcap"]
            vs = (
                f" lowwater = **{sh['lowwater_vs_pmacctd']}x pmacctd**."
                if sh.get("lowwater_vs_pmacctd")
                else ""
            )
            parts += [
                f"{p['packets']:,} packets, {p['groups']:,} groups, {p['data_span_s']:.0f} s, snaplen "
                f"{p['snaplen']}.{vs}",
                grid(
                    sh["rows"],
                    "tool={tool} | packets={packets:,} | seconds={seconds:.3f} | Mpkt/s={mpps:.3f} | vs lowwater={ratio_vs_lowwater:.4f}",
                ),
            ]
        parts.append(img("peers"))
    if d := load("api"):
        parts += [
            "## REST API: top-100 over the last hour of a 10M-row store",
            machine(d),
            f"p50 {d['p50_ms']:.1f} ms, **p95 {d['p95_ms']:.1f} ms**, p99 {d['p99_ms']:.1f} ms "
            f"(target p95 <= {d['target_p95_ms']} ms).",
            "\n![results page](results_page.png)\n" if (RESULTS / "results_page.png").exists() else "",
        ]
    if d := load("aggregates"):
        al = d.get("parts", {}).get("alert_latency")
        if al:
            r = al["result"]
            c, st, h = (
                r["latency_after_close_s"],
                r["latency_after_close_steady_s"],
                r["handoff_to_receiver_s"],
            )
            parts += [
                "## Alert delivery latency after window close (real job, real HTTP receiver)",
                machine(al),
                f"{r['alerts']} alerts ({r['distinct_alerts']} distinct) over {r['windows_with_alerts']} 2-s "
                f"windows, trigger {r['trigger_s']:g} s. After close: p50 {c['p50']:.2f} s, **p95 {c['p95']:.2f} s**"
                f" (warm: p95 {st['p95']:.2f} s); of which the webhook post (sink hand-off -> receiver): "
                f"p50 {h['p50'] * 1e3:.0f} ms, p95 {h['p95'] * 1e3:.0f} ms. Goal p95 <= 1 trigger: "
                f"{'met' if r['goal_met'] else 'not met (the rest of the micro-batch dominates)'}.",
            ]
        kr = d.get("parts", {}).get("kernel_rates")
        if kr:
            r = kr["result"]
            parts += [
                "## Holistic aggregates: kernel rates vs Q4 (same run, one core)",
                machine(kr),
                table(
                    ["query", "Mpkt/s", "vs Q4"],
                    [[n, f"{m:.2f}", f"{r['ratio_vs_q4'].get(n, 1.0):.2f}"] for n, m in r["mpps"].items()],
                ),
                f"**min_ratio_vs_q4 {r['min_ratio_vs_q4']:.2f}** (goal >= {r['goal_min_ratio']}).",
            ]
        he = d.get("parts", {}).get("hll_error")
        if he:
            r = he["result"]
            parts += [
                f"## HyperLogLog error vs memory ({r['distinct']:,} distinct values, {r['seeds']} seeds)",
                machine(he),
                grid(
                    r["by_precision"],
                    "precision={precision} | registers={registers} | max bytes per (pane, group)={max_record_bytes} | "
                    "theory={std_error_theory:.4f} | rms={rms_error:.4f} | max |error|={max_abs_error:.4f}",
                ),
            ]
        aw = d.get("parts", {}).get("adaptwid")
        if aw:
            parts += [
                "## Exact distinct: pane sets vs buffered raw values (AdaptWID, dissertation 6.3)",
                machine(aw),
                grid(
                    aw["result"]["cases"],
                    "panes/window={panes_per_window} | value domain={value_domain} | rows held (sets)={rows_held_pane_sets} | "
                    "rows held (raw)={rows_held_raw} | s (sets)={seconds_pane_sets} | s (raw)={seconds_raw_buffer}",
                ),
            ]
    if d := load("join"):

        def lat(r: dict, k: str) -> str:
            x = r.get(k, {}).get("latency_s") or {}
            return f"{x['p50']} / {x['p95']}" if x else "-"

        job = d.get("job")
        parts += [
            "## Handshake join: OA-Join closed by punctuation vs Spark's stream-stream join and the in-order "
            "baseline",
            machine(d),
            f"{d['query']}: {d['syn_rows']:,} SYN and {d['synack_rows']:,} SYN-ACK rows over 3 hosts, "
            f"{d['batch_messages']} Kafka messages per micro-batch; peak join state per skew (Spark: the "
            "watermark delay = the skew; in-order: buffer until both inputs' marks pass, then sort-merge); "
            "latency = emission (arrival clock of the micro-batch) - the later row's timestamp, p50 / p95 s. "
            "**oa_state_rows_ratio_vs_spark_at_40s = "
            f"{d.get('oa_state_rows_ratio_vs_spark_at_40s')}**; OA-Join input rows/s on one core (in-process): "
            f"{d['oa_input_tuples_per_s_one_core']:,}."
            + (
                f" **input_tuples_per_s = {d['input_tuples_per_s']:,}** through Kafka and the Spark job on "
                f"local[2] ({job['input_rows']:,} rows, {job['rows_per_message']} per message, skew "
                f"{job['skew_s']} s, warm micro-batches of {job['messages_per_batch']} messages; "
                f"{job['input_tuples_per_s_wall']:,} rows/s start to end"
                + (
                    f"; {job['input_tuples_per_cpu_s']:,} rows per CPU-second of the job's processes (CPU s: "
                    + ", ".join(f"{k} {v}" for k, v in job["warm_cpu_s"].items())
                    + f"), load {job.get('load_avg_1_5_15_at_start')}"
                    if "warm_cpu_s" in job
                    else ""
                )
                + ")."
                if job
                else ""
            ),
            table(
                [
                    "skew s",
                    "OA rows",
                    "OA MiB",
                    "in-order rows",
                    "Spark rows",
                    "Spark MiB",
                    "latency OA",
                    "latency in-order",
                    "latency Spark",
                    "Spark pairs - oracle",
                ],
                [
                    [
                        r["skew_s"],
                        f"{r['oa']['peak_state_rows']:,}",
                        f"{r['oa']['peak_state_bytes'] / 2**20:.1f}",
                        f"{r['in_order']['peak_state_rows']:,}" if "in_order" in r else "-",
                        f"{r['spark']['peak_state_rows']:,}" if "spark" in r else "-",
                        f"{r['spark']['peak_state_bytes'] / 2**20:.1f}" if "spark" in r else "-",
                        lat(r, "oa"),
                        lat(r, "in_order"),
                        lat(r, "spark"),
                        r["spark"]["pairs_vs_oracle"] if "spark" in r else "-",
                    ]
                    for r in d["rows"]
                ],
            ),
            img("join"),
        ]
    if d := load("flows"):
        e = d["export"]
        per_cpu_s = {"lowwater_memory": d["records_per_s"]}  # the in-memory rate is records_per_s itself

        parts += [
            "## Flow collection: IPFIX records per CPU-second, lowwater vs nfcapd",
            machine(d),
            f"{e['exporter']} exported a {e['pcap_packets']:,}-packet pcap as {e['datagrams']} IPFIX datagrams "
            f"({e['records']:,} flow records), sent {e['repeat']} times. In memory (decode + weighted kernel, no "
            f"socket): **records_per_s = {d['records_per_s']:,}**. Over UDP, per CPU-second of the collecting "
            f"process: **vs_nfcapd = {d.get('vs_nfcapd')}** (every collector counted every record: "
            f"{d.get('all_records_counted')}).",
            table(
                ["collector", "records", "CPU s", "records per CPU-s"],
                [
                    [
                        name,
                        f"{d[k]['records']:,}",
                        f"{d[k]['cpu_s']:.3f}",
                        f"{d[k].get('records_per_cpu_s', per_cpu_s.get(k, 0)):,}",
                    ]
                    for name, k in (
                        ("lowwater, in memory", "lowwater_memory"),
                        ("lowwater, UDP socket", "lowwater_socket"),
                        ("nfcapd, UDP socket", "nfcapd"),
                    )
                    if k in d
                ],
            ),
        ]
    if (d := load("kernel")) and "select_kernel_mpps" in d:
        parts += [
            f"Select queries in the kernel (`bench_kernel.py --select`): Q4 + the SYN and SYN-ACK selects of "
            f"configs/handshake.yaml in one pass, **select_kernel_mpps = {d['select_kernel_mpps']}** = "
            f"{d['select_vs_q4']} of Q4 in the same rounds (per round {d['select_vs_q4_per_round']}; by CPU "
            f"time {d['select_vs_q4_cpu']}), {d['select_rows']:,} rows of {d['select_packets']:,} packets."
        ]
    if d := load("live_capture"):
        parts += [
            "## Live capture over a veth pair: highest rate with <= 0.1 % loss (tcpreplay -> capturer)",
            machine(d),
            f"{d['frame_bytes']}-byte frames, {d['groups']:,} (src, dst) groups, {d['seconds_per_rate']:g} s per "
            f"rate, one fresh capturer per rate; kernel drops from the capture sockets. **lowwater_vs_pmacctd_"
            f"nodrop_ratio = {d['lowwater_vs_pmacctd_nodrop_ratio']}** (lowwater {d['lowwater_nodrop_pps']:,} "
            f"pkt/s, pmacctd {d['pmacctd_nodrop_pps']:,} pkt/s). {d.get('note', '')}",
            grid(
                [{**r, "loss_pct": 100 * r["loss"]} for r in d["rows"]],
                "capturer={tool} | asked={asked_pps} | senders={senders} | achieved pkt/s={achieved_pps:,} | sent={sent:,} | "
                "counted={counted:,} | loss %={loss_pct:.3f} | kernel drops={kernel_drops:,} | load={load_avg:.1f}",
            ),
            img("live_capture"),
        ]
    if d := load("scaling"):
        parts += [
            "## Roll-up scaling on a Spark standalone cluster: Kafka partitions x workers",
            machine(d),
            f"{d['setup']}. {d['records_per_topic']:,} partial records per run, {d['groups']:,} groups, "
            f"micro-batches <= {d['batch_records']:,} records. **p2_vs_p1 = {d['p2_vs_p1']}** (2 workers), "
            f"p4_vs_p1 {d['p4_vs_p1']}, 2 vs 1 worker at P = 2: {d['w2_vs_w1_at_p2']}. {d.get('limit', '')}",
            grid(
                [
                    {
                        **r,
                        "busy": r.get("executor_cores_busy", "-"),
                        "per_cpu": f"{r['records_per_executor_cpu_s']:,}"
                        if "records_per_executor_cpu_s" in r
                        else "-",
                    }
                    for r in d["rows"]
                ],
                "workers={workers} | P={partitions} | records/s sustained={sustained_records_per_s:,} | batches={batches} | "
                "first batch s={first_batch_seconds} | executor CPU s={executor_cpu_seconds} | executor cores busy={busy} | "
                "records per executor CPU s={per_cpu}",
            ),
            img("scaling"),
        ]
    parts += _reliability(load("reliability"))
    (RESULTS / "README.md").write_text("\n\n".join(p for p in parts if p) + "\n")
    print(f"wrote {RESULTS / 'README.md'}")


if __name__ == "__main__":
    main()
