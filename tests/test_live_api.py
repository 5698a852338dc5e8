"""Live results in the API and on the page: /live/{query} (SSE through the update queue) fed from the real
compacted live topic, and the live panel in real headless Chromium (values update, then turn final)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from contract import live as L
from contract import query as Q
from high_level.live.hub import LiveHub
from high_level.serve.api import create_app
from lowwater_testing.page import CHROMIUM, REPO, chromium, serve_api, stop
from lowwater_testing.store import Store, make_store

ARTIFACT = REPO / "benchmarks" / "results" / "live_panel.png"
W0 = 1_764_000_000_000_000  # a window start (us)


def _upd(
    group: tuple[str, str], packets: int, final: bool, version: int, w0: int = W0, in_mark: int = 1
) -> L.LiveUpdate:
    return L.LiveUpdate(
        query="q4_pairs",
        window_start_us=w0,
        window_end_us=w0 + 60_000_000,
        group={"src_ip": group[0], "dst_ip": group[1]},
        values={"packets": packets},
        final=final,
        version=version,
        published_ms=version * 1000,
        hosts_in_mark=2 if final else in_mark,
        hosts_expected=2,
        complete=final,
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return make_store(tmp_path_factory.mktemp("live") / "results")


class _Source:
    """Stands in for the Kafka reader in the pure SSE test: ingests a fixed sequence on start."""

    def __init__(self, hub: LiveHub, updates: list[L.LiveUpdate]) -> None:
        self.hub, self.updates = hub, updates

    def start(self) -> None:
        for u in self.updates:
            self.hub.ingest_raw(*L.encode(u))
        self.hub.ingest_raw(b"x", b"{not json")  # refused and counted, never guessed at

    def stop(self) -> None:
        pass


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for msg in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in msg.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_sse_serves_the_newest_values_final_last_and_counts_bad_messages(store: Store) -> None:
    a, b = ("10.0.0.1", "10.0.0.2"), ("10.0.0.3", "10.0.0.4")
    ups = [
        _upd(a, 5, False, 1),
        _upd(b, 2, False, 1),
        _upd(a, 9, False, 2),
        _upd(a, 12, True, 3),
        _upd(a, 7, False, 2),
    ]  # (the last: an older version after the final, ignored)
    app = create_app(store.config, store.root, live_source=lambda hub: _Source(hub, ups))
    with TestClient(app) as c:
        st = c.get("/live").json()
        assert st["enabled"] and st["received"] == 5 and st["ignored"] == 1 and st["rejected"] == 1
        vals = c.get("/live/q4_pairs/values").json()["values"]
        assert {(tuple(v["group"].values()), v["values"]["packets"], v["final"]) for v in vals} == {
            (a, 12, True),
            (b, 2, False),
        }
        r = c.get("/live/q4_pairs", params={"policy": "linecutting", "rate": 200, "max_s": 0.5})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ev = _events(r.text)
        assert ev[0] == (
            "hello",
            {"query": "q4_pairs", "policy": "linecutting", "rate": 200.0, "consumer": 1},
        )
        got = [
            (tuple(d["group"].values()), d["values"]["packets"], d["final"]) for e, d in ev if e == "update"
        ]
        assert sorted(got) == [(a, 12, True), (b, 2, False)]
        assert ev[-1][0] == "end" and ev[-1][1]["delivered"] == 2 and ev[-1][1]["policy"] == "linecutting"
        assert c.get("/live/nope").status_code == 404
        assert c.get("/live/q4_pairs", params={"policy": "random"}).status_code == 400
        assert c.get("/live/q4_pairs", params={"rate": 0}).status_code == 400
        assert c.get("/live").json()["consumers"] == []  # the stream unsubscribed at its end
    off = create_app(store.config, store.root)
    with TestClient(off) as c:
        assert c.get("/live").json()["enabled"] is False
        assert c.get("/live/q4_pairs").status_code == 404


def test_update_queues_are_on_metrics_and_status(store: Store) -> None:
    """Each live consumer's queue (policy, load factor, staleness, what the policy did) on /metrics and in
    /status, next to the job's document."""
    a, b = ("10.0.0.1", "10.0.0.2"), ("10.0.0.3", "10.0.0.4")
    sources: list[_Source] = []

    def source(hub: LiveHub) -> _Source:
        sources.append(_Source(hub, [_upd(a, 5, False, 1), _upd(b, 2, False, 1)]))
        return sources[0]

    app = create_app(store.config, store.root, live_source=source)
    with TestClient(app) as c:
        sub = sources[0].hub.subscribe("q4_pairs", "inplace", service_s=0.5)
        sources[0].hub.ingest(_upd(a, 9, False, 2))  # overwrites a's queued cell in place
        text = c.get("/metrics").text
        lab = f'consumer="{sub.id}",policy="inplace",query="q4_pairs"'
        assert "lowwater_api_live_consumers 1.0" in text
        assert f"lowwater_api_live_queued{{{lab}}} 2.0" in text
        assert f"lowwater_api_live_overwrites_total{{{lab}}} 1.0" in text
        assert f"lowwater_api_live_staleness_seconds{{{lab}}}" in text
        assert "lowwater_api_live_updates_received_total 3.0" in text
        live = c.get("/status").json()["live"]
        assert live["enabled"] and live["received"] == 3
        assert [(x["id"], x["policy"], x["overwrites"]) for x in live["consumers"]] == [
            (sub.id, "inplace", 1)
        ]
        sources[0].hub.unsubscribe(sub)
        assert "lowwater_api_live_consumers 0.0" in c.get("/metrics").text


def _serve_live(store: Store, bootstrap: str) -> tuple[subprocess.Popen, str]:
    return serve_api(store, None, "--live-bootstrap", bootstrap)


def _panel(dom: str) -> str:
    """The live panel's part of a dumped page."""
    i = dom.find('<section class="card" id="live"')
    return dom[i : dom.find("</section>", i)] if i >= 0 else ""


def _page(
    base: str, profile: Path, ok, what: str, frag: str = "live_s=3&live_rate=500&live_query=q4_pairs"
) -> str:
    """The dumped page once ``ok(dom)`` holds (Chromium's virtual time may dump before the stream
    delivered everything: try again, a few times)."""
    for i in range(4):
        dom = chromium(f"{base}/ui#{frag}", profile / str(i), "--dump-dom").stdout
        if ok(dom):
            return dom
    raise AssertionError(f"{what}: {_panel(dom) or dom[-2000:]}")


def _wait(base: str, pred, what: str, timeout: float = 30.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        st = httpx.get(f"{base}/live", timeout=30).json()  # it reads what waits: slow under load 30
        if pred(st):
            return st
        if time.monotonic() > end:
            raise AssertionError(f"{what}: {st}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def live_topic(kafka, store: Store) -> Iterator[object]:
    from kafka import KafkaAdminClient, KafkaProducer

    from high_level.live.publish import ensure_live_topics

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    cfg = Q.load(store.config)
    ensure_live_topics(admin, cfg.queries)
    desc = admin.describe_configs(
        [
            __import__("kafka.admin", fromlist=["ConfigResource"]).ConfigResource(
                "TOPIC", L.live_topic("q4_pairs")
            )
        ]
    )
    admin.close()
    assert "compact" in str(desc)
    prod = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks=1)
    try:
        yield prod
    finally:
        prod.close()


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium, or ./lw setup)"
)
def test_live_panel_updates_and_turns_final_from_the_real_topic(
    kafka, live_topic, store: Store, tmp_path: Path
) -> None:
    prod = live_topic
    w0 = (int(time.time()) // 60) * 60 * 1_000_000
    pairs = [(f"10.0.0.{i}", f"192.168.1.{i}") for i in range(1, 7)]

    def send(ups: list[L.LiveUpdate]) -> None:
        for u in ups:
            k, v = L.encode(u)
            prod.send(L.live_topic("q4_pairs"), key=k, value=v)
        prod.flush(10)

    send([_upd(p, 10 * (i + 1), False, 1, w0) for i, p in enumerate(pairs)])
    send([_upd(p, 10 * (i + 1) + 5, False, 2, w0) for i, p in enumerate(pairs)])  # the open window grows
    proc, base = _serve_live(store, kafka.bootstrap_servers)
    try:
        _wait(
            base,
            lambda s: s["received"] + s["coalesced"] >= 12 and s["windows"]["q4_pairs"] >= 1,
            "live values never arrived",
        )
        dom = _page(
            base, tmp_path / "p1", lambda d: _panel(d).count("live-row live-provisional") == 6, "provisional"
        )
        assert 'id="live" style="display: block;"' in dom, dom[-3000:]
        assert dom.count('class="live-row live-provisional"') == 6 and "provisional 1/2" in dom
        panel = _panel(dom)
        assert ">65<" in panel and ">15<" in panel and ">10<" not in panel  # the newest provisional values
        assert "1 of 2 capture hosts past it" in dom
        send([_upd(p, 10 * (i + 1) + 7, True, 3, w0) for i, p in enumerate(pairs)])  # the window closes
        _wait(base, lambda s: s["received"] + s["coalesced"] >= 18, "finals never arrived")
        dom = _page(base, tmp_path / "p2", lambda d: _panel(d).count("live-row live-final") == 6, "final")
        assert dom.count('class="live-row live-final"') == 6 and "live-provisional" not in _panel(dom)
        assert ">67<" in _panel(dom) and 'class="badge final">final<' in _panel(dom)
        shot = tmp_path / "live.png"
        chromium(
            f"{base}/ui#live_s=3&live_rate=500&live_query=q4_pairs", tmp_path / "p3", f"--screenshot={shot}"
        )
        assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, ARTIFACT)
        # the SSE stream straight from the real topic: the current (final) values, through the queue
        with httpx.stream("GET", f"{base}/live/q4_pairs", params={"rate": 100, "max_s": 1}, timeout=10) as r:
            ev = _events(r.read().decode())
        fin = [d for e, d in ev if e == "update"]
        assert len(fin) == 6 and all(d["final"] and d["complete"] for d in fin)
    finally:
        stop(proc)


def _update(
    query: str, w: int, group: dict, values: dict, version: int, final: bool, expected: int = 1
) -> L.LiveUpdate:
    """One update of a 1-minute window from one host, published at second ``version``."""
    return L.LiveUpdate(
        query=query,
        window_start_us=w,
        window_end_us=w + 60_000_000,
        group=group,
        values=values,
        final=final,
        version=version,
        published_ms=version * 1000,
        hosts_in_mark=1,
        hosts_expected=expected,
        complete=final,
    )


def _syns(w: int, port: int, syns: int, version: int, final: bool) -> L.LiveUpdate:
    values = {"syns": syns, "min_ttl": 64}
    return _update("syn_per_port", w, {"dst_port": port}, values, version, final, 1 if final else 2)


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium, or ./lw setup)"
)
def test_live_panel_opens_on_the_newest_window_at_the_pages_rate(
    kafka, live_topic, store: Store, tmp_path: Path
) -> None:
    """What ``./lw run`` shows: the topic holds two closed windows and the open one, thousands of groups
    each, and the page asks for 20 updates/s. The panel must open on the newest window, its largest
    values first (offered oldest window first, it showed a closed window for minutes)."""
    topic = L.live_topic("syn_per_port")  # a topic of its own in this module
    w_new = (int(time.time()) // 10) * 10 * 1_000_000
    n = 1500
    ups = [_syns(w_new - 20_000_000, 20000 + i, 3 + i % 7, 4, True) for i in range(n)]  # closed
    ups += [_syns(w_new - 10_000_000, 30000 + i, 3 + i % 7, 5, True) for i in range(n)]  # closed
    ups += [_syns(w_new, 40000 + i, 10 + (i * 7919) % n, 6, False) for i in range(n)]  # open, newest
    for u in ups:
        k, v = L.encode(u)
        live_topic.send(topic, key=k, value=v)
    live_topic.flush(30)
    top = sorted((u for u in ups if u.window_start_us == w_new), key=lambda u: -u.values["syns"])
    proc, base = _serve_live(store, kafka.bootstrap_servers)
    try:
        _wait(
            base,
            lambda s: s["received"] + s["coalesced"] >= 3 * n and s["windows"]["syn_per_port"] == 3,
            "live values never arrived",
        )
        # the stream at the page's rate: its first updates are the newest window's, largest first
        with httpx.stream(
            "GET", f"{base}/live/syn_per_port", params={"rate": 20, "max_s": 1}, timeout=10
        ) as r:
            first = [d for e, d in _events(r.read().decode()) if e == "update"]
        assert first, "no update within a second"
        assert [d["group"]["dst_port"] for d in first] == [u.group["dst_port"] for u in top[: len(first)]]
        ports = lambda d: {int(p) for p in re.findall(r'class="key">(\d+)<', _panel(d))}  # noqa: E731
        dom = _page(
            base,
            tmp_path,
            lambda d: len(ports(d)) >= 3,
            "the panel showed no rows",
            frag="live_s=3&live_query=syn_per_port",  # the page's own rate (20 updates/s)
        )
        shown = ports(dom)
        assert shown <= {u.group["dst_port"] for u in top[:10]}, (sorted(shown), _panel(dom)[:2000])
        panel = _panel(dom)
        assert 'class="badge provisional">open<' in panel and "live-final" not in panel, panel[:2000]
    finally:
        stop(proc)
        _delete_topic(kafka, topic)  # its 4,500 recent messages are not the later tests' to read


def _delete_topic(kafka, topic: str) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.delete_topics([topic], timeout_ms=30_000)
    finally:
        admin.close()


def test_hub_keeps_the_newest_windows_indexed_and_counts_tombstones(store: Store) -> None:
    """The live table keeps KEEP_WINDOWS windows whatever the arrival order; its index of window starts
    (a heap, not a sort of every key per insert) always matches the table."""
    from high_level.live.hub import KEEP_WINDOWS

    hub = LiveHub([Q.load(store.config).query("q4_pairs")])
    order = [3, 1, 7, 5, 2, 9, 8, 4, 6, 0]  # windows out of order, 50 groups each
    for w in order:
        for g in range(50):
            hub.ingest(_upd((f"10.0.{w}.{g}", "10.9.9.9"), g + 1, False, 1, W0 + w * 60_000_000))
    starts = sorted({k[0] for k in hub.latest["q4_pairs"]})
    assert starts == [W0 + w * 60_000_000 for w in (7, 8, 9)][-KEEP_WINDOWS:]
    assert sorted(hub.windows["q4_pairs"]) == starts and sorted(hub.starts["q4_pairs"]) == starts
    assert sum(len(v) for v in hub.windows["q4_pairs"].values()) == len(hub.latest["q4_pairs"]) == 150
    assert hub.stats()["windows"]["q4_pairs"] == KEEP_WINDOWS
    key, _ = L.encode(_upd(("10.0.9.1", "10.9.9.9"), 1, True, 2, W0 + 9 * 60_000_000))
    assert hub.ingest_raw(key, None) is False  # a tombstone: counted, not an error, the value stays
    assert hub.tombstones == 1 and hub.rejected == 0 and len(hub.latest["q4_pairs"]) == 150


def test_values_of_a_query_nobody_consumes_are_read_only_when_asked(store: Store) -> None:
    """Messages of a query without a consumer wait unread, the newest per key; whoever asks (values, a new
    consumer, /live) reads them first, in arrival order, with the same checks: a bad one is still
    refused and counted, an older version still ignored, and a replaced one counted as coalesced."""
    from high_level.live import hub as H

    hub = LiveHub([Q.load(store.config).query("q4_pairs")])
    a, b = ("10.0.0.1", "10.0.0.2"), ("10.0.0.3", "10.0.0.4")
    for u in (_upd(a, 5, False, 1), _upd(a, 9, False, 2), _upd(b, 2, False, 1)):
        assert hub.ingest_raw(*L.encode(u), "q4_pairs") is True
    k_bad, _ = L.encode(_upd(("10.9.9.9", "10.9.9.8"), 1, False, 1))
    hub.ingest_raw(k_bad, b"{not json", "q4_pairs")
    assert hub.received == 0 and len(hub.unread["q4_pairs"]) == 3 and hub.coalesced == 1
    vals = {tuple(v["group"].values()): v["values"]["packets"] for v in hub.snapshot("q4_pairs")}
    assert vals == {a: 9, b: 2} and hub.received == 2 and hub.rejected == 1 and not hub.unread["q4_pairs"]
    hub.ingest_raw(*L.encode(_upd(a, 12, True, 3)), "q4_pairs")
    hub.ingest_raw(*L.encode(_upd(b, 1, False, 0)), "q4_pairs")  # an older version: ignored when read
    sub = hub.subscribe("q4_pairs", "inplace", service_s=0.01)  # a consumer reads what waited first
    got = {}
    while (item := sub.take()) is not None:
        got[tuple(item.value.group.values())] = (item.value.values["packets"], item.final)
    assert got == {a: (12, True), b: (2, False)} and hub.ignored == 1
    hub.ingest_raw(*L.encode(_upd(b, 4, False, 5)), "q4_pairs")  # with a consumer: read at once
    assert not hub.unread["q4_pairs"] and sub.take().value.values["packets"] == 4
    hub.unsubscribe(sub)
    received = hub.received
    for i in range(H.MAX_UNREAD + 1):  # bounded like the table, and nothing decoded for that
        w = W0 + (i // 5000) * 60_000_000  # windows 0-3 of 5000 groups, then one value of window 4
        u = _upd((f"10.1.{i % 5000 // 250}.{i % 250}", "10.0.0.9"), 1, False, 9, w)
        hub.ingest_raw(*L.encode(u), "q4_pairs")
    # at MAX_UNREAD held, window 0's values went undecoded (the table would drop them on reading)
    assert hub.received == received and len(hub.unread["q4_pairs"]) == 3 * 5000 + 1
    assert hub.coalesced == 1 + 5000
    st = hub.stats()  # reads them, but for window 1's: four windows waited, the table keeps three
    assert st["coalesced"] == 1 + 2 * 5000 and hub.received == received + 2 * 5000 + 1
    assert sorted(hub.windows["q4_pairs"]) == [W0 + w * 60_000_000 for w in (2, 3, 4)]
    assert not hub.unread["q4_pairs"]


def test_unread_values_of_windows_the_table_would_drop_are_never_decoded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll's records of a query nobody consumes go in as a batch; when too many wait, the values of
    windows older than the newest KEEP_WINDOWS are dropped undecoded (counted as coalesced), and the table
    then holds what reading every message in order gives. A tombstone and a keyless value are counted."""
    from high_level.live import hub as H

    monkeypatch.setattr(H, "MAX_UNREAD", 600)
    q = Q.load(store.config).query("q4_pairs")
    hub, ref = LiveHub([q]), LiveHub([q])
    ups = [
        _upd((f"10.0.{w}.{g}", "10.9.9.9"), w * 100 + g, False, 1, W0 + w * 60_000_000)
        for w in range(6)
        for g in range(120)
    ]
    recs: list[tuple[bytes | None, bytes | None]] = [L.encode(u) for u in ups]
    recs += [(recs[0][0], None), (None, b"{}")]
    for i in range(0, len(recs), 100):  # poll batches of 100
        hub.ingest_batch("q4_pairs", recs[i : i + 100])
    assert hub.tombstones == 1 and hub.rejected == 1
    # at 600 waiting (5 windows), the 2 oldest went undecoded and nothing was read; the next limit is
    # twice the 360 left, so the sixth window waits too
    assert hub.coalesced == 2 * 120 and hub.received == 0 and len(hub.unread["q4_pairs"]) == 4 * 120
    for u in ups:
        ref.ingest(u)
    assert hub.snapshot("q4_pairs") == ref.snapshot("q4_pairs")  # window 2 went undecoded too
    assert hub.coalesced == 3 * 120 and hub.received == 3 * 120
    assert hub.received + hub.coalesced == len(ups)


def test_metrics_and_status_read_no_waiting_value_and_live_does(store: Store) -> None:
    """What is polled (/metrics by Prometheus, /status by the page) decodes nothing that waits unread: it
    shows the counts so far and how many wait; /live and the values read them."""
    sources: list[_Source] = []

    def source(hub: LiveHub) -> _Source:
        sources.append(_Source(hub, []))
        return sources[0]

    app = create_app(store.config, store.root, live_source=source)
    with TestClient(app) as c:
        hub = sources[0].hub
        hub.rejected = 0  # the stand-in's bad message
        for g in range(3):
            hub.ingest_raw(*L.encode(_upd((f"10.0.0.{g}", "10.9.9.9"), g + 1, False, 1)), "q4_pairs")
        text = c.get("/metrics").text
        assert "lowwater_api_live_updates_received_total 0.0" in text
        assert "lowwater_api_live_unread_values 3.0" in text
        assert c.get("/status").json()["live"]["received"] == 0 and hub.received == 0
        st = c.get("/live").json()
        assert st["received"] == 3 and st["unread"] == 0
        assert "lowwater_api_live_unread_values 0.0" in c.get("/metrics").text


def test_reading_skips_unread_values_of_windows_older_than_the_tables(store: Store) -> None:
    """Values waiting unread of a window older than the newest KEEP_WINDOWS the table already holds are
    dropped undecoded when someone asks (even a malformed one: it would never be shown), a key that does
    not parse is still refused and counted, and what is left reads as if every message had been read."""
    q = Q.load(store.config).query("q4_pairs")
    hub, ref = LiveHub([q]), LiveHub([q])
    for w in (7, 8, 9):
        for h in (hub, ref):
            h.ingest(_upd(("10.0.0.1", "10.9.9.9"), w, False, 1, W0 + w * 60_000_000))
    old = _upd(("10.0.0.2", "10.9.9.9"), 5, False, 1, W0 + 6 * 60_000_000)
    new = _upd(("10.0.0.1", "10.9.9.9"), 99, False, 2, W0 + 9 * 60_000_000)
    recs = [L.encode(old), (L.encode(old)[0].replace(b"10.0.0.2", b"10.0.0.3"), b"{bad"), L.encode(new)]
    recs.append((b"no key", L.encode(new)[1]))
    hub.ingest_batch("q4_pairs", recs)
    assert hub.received == 3 and len(hub.unread["q4_pairs"]) == 4
    for u in (old, new):
        ref.ingest(u)
    assert hub.snapshot("q4_pairs") == ref.snapshot("q4_pairs")
    assert (
        hub.received == 4 and hub.coalesced == 2 and hub.rejected == 1 and "does not match" in hub.last_error
    )


def test_a_poll_of_a_burst_runs_no_collection_once_the_reader_started(store: Store) -> None:
    """A poll holds POLL_MESSAGES messages at once and frees them by reference counting: at the
    collector's default young threshold (700) it runs collections that move them to the old generation,
    which made full collections of the whole process frequent; with the reader's threshold it runs none."""
    import gc

    from high_level.live import hub as H

    cfg = Q.load(store.config)
    key, value = L.encode(_dst24(W0, "10.1.0.0", 1, 1, False))

    class Consumer:
        def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
            return [_Msg(L.live_topic("bytes_per_dst24"), key, value) for _ in range(num_messages)]

    src = H.KafkaLiveSource(LiveHub(cfg.queries), "unused:9092", consumer=Consumer())
    runs: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            runs.append(info["generation"])

    before = gc.get_threshold()
    gc.callbacks.append(count)
    try:
        for threshold in (700, None):  # the default, then the reader's
            if threshold is None:
                H.collect_polls_young()
            else:
                gc.set_threshold(threshold, *before[1:])
            gc.collect()
            runs.clear()
            assert src.poll_once(0.2) == H.POLL_MESSAGES
            if threshold is not None:
                assert len(runs) > 10
        assert runs == [] and gc.get_threshold()[0] == H.GC_YOUNG_THRESHOLD
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*before)


# earlier runs' values on the compacted topic (the issue saw ~400K, replayed at 1.7K/s)
OLD_MESSAGES = 150_000


def _dst24(w: int, net: str, nbytes: int, version: int, final: bool) -> L.LiveUpdate:
    values = {"bytes": nbytes, "packets": 1, "avg_len": float(nbytes), "max_len": nbytes}
    return _update("bytes_per_dst24", w, {"dst_ip_24": net}, values, version, final)


def test_a_restarted_api_is_current_within_seconds_over_a_topic_of_old_runs(
    kafka, live_topic, store: Store
) -> None:
    """The API's live reader starts from the topic's recent messages (by time), not its beginning: over a
    topic holding OLD_MESSAGES values of earlier runs (published an hour ago, as a producer stamps them:
    in order), a restarted API shows the current window within 10 s of its start and never reads them."""
    from kafka import KafkaProducer

    topic = L.live_topic("bytes_per_dst24")  # a topic of its own: nothing else published on it
    bulk = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks=1, linger_ms=50, batch_size=1 << 20)
    hour_ago = int(time.time() * 1000) - 3_600_000
    doc = json.loads(_dst24(W0, "10.1.0.0", 1, 1, True).model_dump_json())
    for i in range(OLD_MESSAGES):
        w = W0 - 86_400_000_000 + (i // 1000) * 60_000_000  # 150 old windows of 1000 groups
        g = {"dst_ip_24": f"10.{i % 1000 // 250}.{i % 250}.0"}
        v = {**doc, "window_start_us": w, "window_end_us": w + 60_000_000, "group": g}
        bulk.send(
            topic,
            key=json.dumps([w, list(g.values())], separators=(",", ":")).encode(),
            value=json.dumps(v, separators=(",", ":")).encode(),
            timestamp_ms=hour_ago + i // 100,
        )
    bulk.flush(120)
    bulk.close()

    def current(version: int) -> int:
        w_now = (int(time.time()) // 60 + version) * 60 * 1_000_000
        for i in range(5):
            k, v = L.encode(_dst24(w_now, f"10.3.{i}.0", 10 + i, version, False))
            live_topic.send(topic, key=k, value=v)
        live_topic.flush(10)
        return w_now

    for restart in (1, 2):  # a first start, then a restart: each is current within the bound
        w_now = current(restart)
        t0 = time.monotonic()
        proc, base = _serve_live(store, kafka.bootstrap_servers)
        try:
            while True:
                vals = httpx.get(f"{base}/live/bytes_per_dst24/values", timeout=5).json()["values"]
                if sum(v["window_start_us"] == w_now for v in vals) == 5:
                    break
                took = time.monotonic() - t0
                assert took < 10, f"restart {restart}: not current after {took:.1f} s: {len(vals)} values"
                time.sleep(0.1)
            took = time.monotonic() - t0
            st = httpx.get(f"{base}/live", timeout=5).json()
            assert st["received"] + st["coalesced"] < OLD_MESSAGES // 100, st  # the old runs were skipped
        finally:
            stop(proc)
        print(f"\nrestart {restart}: current after {took:.2f} s, {st['received']} messages read")


class _Msg:
    """A record (or an event) as librdkafka's consumer hands it over."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None, error: object = None) -> None:
        self._t, self._k, self._v, self._e = topic, key, value, error

    def topic(self) -> str:
        return self._t

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def error(self) -> object:
        return self._e


def test_one_poll_feeds_each_query_its_records_in_order_and_reports_events(store: Store) -> None:
    """The reader hands a poll's records to the hub per topic, each topic in arrival order (later values of
    a key replace earlier ones), and an error event is shown on /live, never taken for a record."""
    from high_level.live.hub import KafkaLiveSource

    cfg = Q.load(store.config)
    hub, ref = LiveHub(cfg.queries), LiveHub(cfg.queries)
    pairs = [_upd((f"10.0.0.{i % 3}", "10.9.9.9"), i, i == 5, i) for i in range(6)]
    dst = [_dst24(W0, f"10.1.{i % 2}.0", 100 + i, i, False) for i in range(4)]
    msgs = [_Msg(L.live_topic(u.query), *L.encode(u)) for u in (*pairs, *dst)]
    msgs = [m for pair in zip(msgs[:4], msgs[6:], strict=True) for m in pair] + msgs[4:6]  # interleaved
    msgs.insert(3, _Msg(L.live_topic("q4_pairs"), None, None, error="_TRANSPORT: broker down"))

    class Consumer:
        def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
            assert num_messages >= 20_000  # a whole burst per poll
            return msgs

    src = KafkaLiveSource(hub, "unused:9092", consumer=Consumer())
    assert src.poll_once(0.2) == len(msgs)
    assert "_TRANSPORT: broker down" in hub.source_error
    for u in (*pairs, *dst):
        ref.ingest(u)
    for q in ("q4_pairs", "bytes_per_dst24"):
        assert hub.snapshot(q) == ref.snapshot(q)
    assert [v["values"]["packets"] for v in hub.snapshot("q4_pairs")] == [3, 4, 5]  # the newest per key
    assert hub.received + hub.coalesced == len(pairs) + len(dst)
