"""An agent killed (SIGKILL) mid-stream and restarted: the loss is bounded to what the dead
incarnation had not flushed (panes at or after its last punctuation), the high level reports the
restart and the range of possibly incomplete windows, and every window below that range is exact."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from contract import query as Q
from contract import wire
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from low_level.capture.sources.generator import generate_frames
from lowwater_testing.agent import spawn_agent
from lowwater_testing.queries import config, pairs
from lowwater_testing.topics import read_topic

NS = 1_000_000_000
START = 1_700_000_000 * NS
PPS = 20_000
GROUPS = 400


def agent(cfg: Path, bootstrap: str, host: str, source: str) -> subprocess.Popen:
    return spawn_agent(cfg, source, text=False, new_session=True, host=host, bootstrap=bootstrap)


def test_agent_sigkill_restart_loss_is_bounded_and_reported(kafka, topic_factory, tmp_path: Path) -> None:
    topic = topic_factory(partitions=2)
    cfg = tmp_path / "q.yaml"
    config(pairs(window="1s", topic=topic, partitions=2)).write(cfg)
    q = Q.load(cfg).queries[0]
    common = f"groups={GROUPS},clock=synthetic,synthetic_pps={PPS},rate={PPS}"
    first = agent(
        cfg, kafka.bootstrap_servers, "cap", f"generator:{common},start_ns={START},count={PPS * 60}"
    )
    # let it run a few seconds of data (and wall) time, until several marks are in Kafka, then kill it
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        msgs = read_topic(kafka.bootstrap_servers, topic, 2)
        marks = [b.mark_pane for v in msgs[0] if isinstance(b := wire.decode(v), wire.Punctuation)]
        if len(marks) >= 3 and marks[-1] - (START // NS) >= 3:
            break
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    before = read_topic(kafka.bootstrap_servers, topic, 2)
    last_mark = min(
        max(b.mark_pane for v in vs if isinstance(b := wire.decode(v), wire.Punctuation))
        for vs in before.values()
    )
    assert START // NS < last_mark < START // NS + 60, last_mark
    # the restarted agent goes on 3 s of data time after the last mark, for 2 s
    resume = (last_mark - START // NS + 3) * PPS
    start2 = START + resume * (NS // PPS)
    second = agent(
        cfg, kafka.bootstrap_servers, "cap", f"generator:{common},start_ns={start2},count={2 * PPS}"
    )
    out = second.communicate(timeout=120)[0]
    assert second.returncode == 0, out.decode(errors="replace").split("Traceback")[-1][-3000:]

    lay = Layout.of(q)
    frames = []
    statuses = []
    msgs = read_topic(kafka.bootstrap_servers, topic, 2)
    for p, vals in msgs.items():
        proc = PartitionProcessor([lay], p, Settings(host_timeout_ms=10**9))
        df = proc.process(vals, 1_000)
        frames.append(df[df["kind"] == "final"])
        statuses.append(proc.status(proc.queries[q.name], 1_000))
    finals = pd.concat(frames)
    for st in statuses:
        host = st.hosts["cap"]
        assert host.restarts == 1, host
        gap = host.last_restart
        assert (
            gap is not None
            and gap.incomplete_from_pane <= last_mark + 1
            and gap.new_mark_pane >= gap.incomplete_from_pane
        )
    # exact below the dead incarnation's last mark; only windows from there on may miss packets
    ts1 = generate_frames(resume, groups=GROUPS, synthetic_pps=PPS, start_ns=START)[3]
    ts2 = generate_frames(2 * PPS, groups=GROUPS, synthetic_pps=PPS, start_ns=start2)[3]
    want = Counter(((np.concatenate([ts1, ts2]) - q.window.origin_ns) // q.window.pane_ns).tolist())
    got = Counter()
    for w, s in zip(finals["window"], finals["state"], strict=True):
        got[int(w)] += int(s[0])
    safe = [w for w in want if w < last_mark]
    assert safe and all(got[w] == want[w] for w in safe)
    lost = sum(want[w] - got[w] for w in want if w >= last_mark and w < resume // PPS + START // NS)
    assert lost >= 0 and all(got[w] <= want[w] for w in want)
    assert lost <= (resume // PPS + START // NS - last_mark) * PPS  # bounded by the unflushed panes
    after = [w for w in want if w >= START // NS + resume // PPS + 1]
    assert all(got[w] == want[w] for w in after), "the new incarnation's windows are exact"
    assert np.all(np.asarray(finals["hosts"]) >= 1)
