"""The live update queue (high_level/live/queue.py) and the staleness meter: pure logic, simulated clock."""

from __future__ import annotations

import random

import numpy as np
import pytest

from high_level.live.queue import POLICIES, Skipped, Update, UpdateQueue, replay
from high_level.live.staleness import StalenessMeter


def _arrivals(
    n_groups: int,
    n: int,
    period: float,
    zipf: float = 0.0,
    windows: int = 1,
    seed: int = 1,
    finals: bool = True,
) -> list[tuple[float, Update]]:
    """``n`` provisional updates of (window, group) at evenly spaced times, groups drawn uniformly or
    Zipf-skewed, windows one after the other (each ends with the final of every group it touched)."""
    rng = random.Random(seed)
    w8 = np.array([1 / (i + 1) ** zipf for i in range(n_groups)])
    w8 = (w8 / w8.sum()).tolist()
    out, t, version = [], 0.0, {}
    per_window = n // windows
    for w in range(windows):
        touched = []
        for _ in range(per_window):
            g = rng.choices(range(n_groups), w8)[0]
            v = version[(w, g)] = version.get((w, g), 0) + 1
            out.append((t, Update(w, g, (w, g, v), False, v)))
            touched.append(g)
            t += period
        if finals:
            for g in sorted(set(touched)):
                v = version[(w, g)] = version[(w, g)] + 1
                out.append((t, Update(w, g, (w, g, v), True, v)))
                t += period
    return out


def _items(out):
    return [u for _, u in out if isinstance(u, Update)]


def test_overwrite_keeps_the_keys_position():
    q = UpdateQueue("inplace")
    for g in "abc":
        q.offer(Update(0, g, f"{g}1", version=1), 0.0)
    q.offer(Update(0, "a", "a2", version=2), 0.5)
    got = [q.take(1.0 + i) for i in range(4)]
    assert [u.value for u in got[:3]] == ["a2", "b1", "c1"] and got[3] is None
    assert q.stats.overwrites == 1 and q.stats.delivered == 3


def test_fifo_keeps_every_update():
    q = UpdateQueue("fifo")
    for i, g in enumerate("aba"):
        q.offer(Update(0, g, f"{g}{i}", version=i + 1), float(i))
    assert [q.take(5.0).value for _ in range(3)] == ["a0", "b1", "a2"]


def test_linecutting_serves_inplace_order_when_all_keys_update_at_the_same_rate():
    # 8 groups updating round robin (the same rate each), load factor 3
    timed = [(i * 1.0, Update(0, i % 8, i, False, i // 8 + 1)) for i in range(400)]
    seqs = {}
    for pol in ("inplace", "linecutting"):
        q = UpdateQueue(pol, service_s=3.0)
        seqs[pol] = [
            (u.group, u.version) for u in _items(replay(q, [(t, Update(**vars(u))) for t, u in timed]))
        ]
        assert q.stats.overwrites > 0  # overloaded: the order matters
    assert seqs["inplace"] == seqs["linecutting"]


def test_linecutting_lets_a_slow_updater_cut_the_line():
    q = UpdateQueue("linecutting", service_s=1.0)
    for t in range(0, 40, 10):  # a slow group: every 10 s
        q.offer(Update(0, "slow", t, version=t + 1), float(t))
        q.take(float(t))
    for i, g in enumerate("abcdef"):  # fast groups queue up first
        q.offer(Update(0, g, i, version=1), 40.0 + i * 0.01)
        q.last_arrival[g], q.interval[g] = 40.0, 0.1
    q.offer(Update(0, "slow", 99, version=99), 40.2)
    assert q.take(40.3).group == "slow"  # IN-PLACE would serve "a" first
    i2 = UpdateQueue("inplace")
    for i, g in enumerate("abcdef"):
        i2.offer(Update(0, g, i, version=1), 40.0 + i * 0.01)
    i2.offer(Update(0, "slow", 99, version=99), 40.2)
    assert i2.take(40.3).group == "a"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("zipf", [0.0, 1.2])
def test_delivered_values_per_key_are_an_ordered_subsequence_of_the_ideal_output(policy, zipf):
    timed = _arrivals(20, 2000, 1.0, zipf=zipf, windows=5, seed=7)
    ideal = {}
    for _, u in timed:
        ideal.setdefault(u.key, []).append(u.version)
    q = UpdateQueue(policy, service_s=4.0, drop_p=0.6 if policy == "random" else 0.0, seed=3)
    got = {}
    for _, u in replay(q, timed):
        if isinstance(u, Update):
            got.setdefault(u.key, []).append(u.version)
    assert got
    for key, vs in got.items():
        assert vs == sorted(set(vs)), f"{key}: out of order or repeated {vs}"
        assert set(vs) <= set(ideal[key])
    assert q.stats.delivered < q.stats.offered  # load factor 4: not everything goes through


@pytest.mark.parametrize("policy", ["fifo", "inplace", "linecutting"])
@pytest.mark.parametrize("lf", [0.5, 1.0])
def test_nothing_is_lost_at_load_factor_at_most_one(policy, lf):
    timed = _arrivals(10, 600, 1.0, windows=3, seed=2)
    q = UpdateQueue(policy, service_s=lf * 1.0)
    out = _items(replay(q, timed))
    assert [(u.key, u.version) for u in out] == [(u.key, u.version) for _, u in timed]
    assert (q.stats.overwrites, q.stats.dropped, q.stats.skipped_windows) == (0, 0, 0)
    assert q.load_factor(timed[-1][0]) == pytest.approx(lf, rel=0.01)


@pytest.mark.parametrize("policy", POLICIES)
def test_no_provisional_after_its_final_and_final_supersedes(policy):
    timed = _arrivals(15, 1500, 1.0, zipf=1.0, windows=6, seed=11)
    # a provisional offered after its final (a replayed batch, say) must never be delivered
    t_last, last = timed[-1]
    timed.append((t_last + 0.5, Update(last.window, last.group, "stale", False, 1)))
    q = UpdateQueue(policy, service_s=5.0, drop_p=0.3 if policy == "random" else 0.0, seed=5)
    finals_seen = set()
    for _, u in replay(q, timed):
        if isinstance(u, Update):
            assert u.key not in finals_seen, f"{u.key} delivered after its final"
            if u.final:
                finals_seen.add(u.key)
    assert q.stats.refused_after_final >= 1 or last.window in q.skipped


def _windows_all_or_nothing(out, timed):
    finals = {}
    for _, u in timed:
        if u.final:
            finals.setdefault(u.window, set()).add(u.group)
    got, skipped = {}, set()
    for _, u in out:
        if isinstance(u, Skipped):
            skipped.add(u.window)
        elif u.final:
            got.setdefault(u.window, set()).add(u.group)
    for w, groups in finals.items():
        if w in skipped:
            assert w not in got, f"window {w} skipped after a final of it was delivered (undo)"
        else:
            assert got.get(w) == groups, f"window {w} delivered short: {len(got.get(w, ()))}/{len(groups)}"
    return skipped


def test_random_drop_skips_whole_windows_never_short_ones():
    timed = _arrivals(30, 3000, 1.0, windows=10, seed=4)
    q = UpdateQueue("random", service_s=2.0, drop_p=0.05, seed=9)
    skipped = _windows_all_or_nothing(replay(q, timed), timed)
    assert skipped and q.stats.skipped_windows == len(skipped)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_full_queue_sheds_the_oldest_uncommitted_window_whole(policy):
    timed = _arrivals(40, 4000, 1.0, windows=8, seed=6)
    q = UpdateQueue(policy, service_s=3.0, max_cells=25)
    out = replay(q, timed)
    skipped = _windows_all_or_nothing(out, timed)
    assert skipped and q.stats.skipped_windows == len(skipped)
    assert q.stats.max_cells <= 25 + 40  # over the cap only for the finals of a committed window


def test_inplace_memory_is_one_cell_per_live_key():
    """The seed's bound for tuple-based updates: one cell per update key, here per (window, group) that
    has an update not yet served; the append queue holds the whole backlog instead."""
    timed = _arrivals(25, 5000, 1.0, zipf=1.1, windows=4, seed=8)
    for pol in ("inplace", "linecutting", "fifo"):
        q = UpdateQueue(pol, service_s=8.0)
        waiting: set = set()
        for i, (t, u) in enumerate(timed):
            q.offer(Update(**vars(u)), t)
            waiting.add(u.key)
            if i % 8 == 0:
                got = q.take(t)
                if isinstance(got, Update) and not any(x.key == got.key for x in q.fifo):
                    waiting.discard(got.key)
            if pol != "fifo":
                assert len(q.cells) <= len(waiting)
        if pol == "fifo":
            assert q.stats.max_cells > 1000
        else:
            assert q.stats.max_cells <= 25 * 4 + 1


def test_staleness_of_a_key_as_the_seed_defines_it():
    m = StalenessMeter()
    m.arrive("k", 1, 0.0)
    assert m.deliver("k", 1, 1.0) == 0.0  # fresh: S(o) = 0
    m.arrive("k", 2, 2.0)
    m.arrive("k", 3, 3.0)
    assert m.deliver("k", 2, 5.0) == 2.0  # superseded by version 3 since t=3
    assert m.current(5.5) == (2.5, 2.5)
    assert m.deliver("k", 3, 6.0) == 0.0
    # area: 0.5 over [0,1], 0 over [1,2], 4.5 over [2,5], 2.5 over [5,6] -> 7.5 / 6
    assert m.key_average("k", 6.0) == pytest.approx(7.5 / 6)
    m.finish("k", 6.0)
    assert m.stream_average(100.0) == pytest.approx(7.5 / 6)


def test_inplace_is_far_fresher_than_fifo_under_overload():
    timed = _arrivals(20, 4000, 1.0, windows=4, seed=12)
    avg = {}
    for pol in ("fifo", "inplace"):
        q = UpdateQueue(pol, service_s=4.0)
        replay(q, [(t, Update(**vars(u))) for t, u in timed])
        avg[pol] = q.meter.stream_average(q.last_time)
    assert avg["inplace"] < avg["fifo"] / 5
