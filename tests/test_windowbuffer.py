"""UpStream's window buffers (high_level/live/windowbuffer.py) against the seed's traces (Figs. 10, 11)
and a brute-force model on random streams: delivered results are whole original windows, the committed
window is the one the paper's rule names, memory stays within the stated bound. Pure logic, < 1 s."""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right

import pytest

from high_level.live.windowbuffer import EagerWindowBuffer, LazyWindowBuffer, make


def _drain(buf, out: dict) -> None:
    """The query consumes what is available of its committed window; delivers it when whole."""
    while buf.take() is not None:
        pass
    if buf.done():
        a = buf.release()
        out[a] = buf  # delivered


def test_lazy_trace_fig10() -> None:
    """w = 5, s = 2: S1 after 5 commits [1, 5]; [3, 7] and [5, 9] are overwritten; S2 after 11 commits [7, 11]."""
    b = LazyWindowBuffer(5, 2, origin=1)
    commits, closed = [], []
    for t in range(1, 13):
        closed += b.arrive(t, 1.0)
        if t in (5, 11):  # S1, S2
            commits.append(b.commit())
            _drain(b, {})
    assert closed == [1, 3, 5, 7]
    assert commits == [1, 7]
    assert b.overwritten == 2  # [3, 7] by [5, 9], [5, 9] by [7, 11]
    assert b.max_held <= b.bound


def test_eager_trace_fig11() -> None:
    """w = 5, s = 2: S1 after 1 commits [1); starters 3..9 empty the EB in turn; S2 after 11 commits [11)."""
    b = EagerWindowBuffer(5, 2, origin=1)
    commits, eb = [], []
    for t in range(1, 13):
        b.arrive(t, 1.0)
        eb.append(b.eb)
        if t in (1, 11):
            commits.append(b.commit())
        while b.take() is not None:  # the query consumes the committed window as it arrives
            pass
        if b.done():
            b.release()
    assert commits == [1, 11]
    assert eb == [1, None, 3, 3, 5, 5, 7, 7, 9, 9, 11, None]  # EB emptied by S1, refilled by each starter
    assert b.max_held <= b.bound


@pytest.mark.parametrize("policy", ["lazy", "eager"])
@pytest.mark.parametrize("w,s", [(5, 2), (10, 1), (10, 10), (4, 7), (1, 1)])
def test_random_streams_against_oracle(policy: str, w: int, s: int) -> None:
    rng = random.Random(hash((policy, w, s)) & 0xFFFF)
    for _ in range(12):
        buf = make(policy, w, s, origin=0)
        ts, vals, t = [], {}, -1
        results: dict[int, float] = {}
        acc = 0.0
        for _ in range(rng.randint(5, 120)):
            t += 1 if rng.random() < 0.85 else rng.randint(2, 2 * w + s)  # gaps too
            v = float(rng.randint(1, 9))
            buf.arrive(t, v)
            ts.append(t)
            vals[t] = v
            assert buf.held <= buf.bound
            if rng.random() < 0.3:  # a scheduling point
                expect_eb = buf.eb
                if buf.db is None and expect_eb is not None:
                    starts = [
                        a for a in range(0, t + 1, s) if bisect_right(ts, a + w - 1) > bisect_left(ts, a)
                    ]
                    if policy == "lazy":  # the most recently closed window (by the tuple that closed it)
                        closed = [a for a in starts if a + w - 1 <= t]
                        assert expect_eb == max(closed, key=lambda a: (ts[bisect_left(ts, a + w - 1)], a))
                    else:  # the most recently started one
                        assert expect_eb == max(starts)
                a = buf.commit()
                if a is not None:
                    acc = 0.0
            for _ in range(rng.randint(0, 3)):  # the query consumes some tuples
                got = buf.take()
                if got is None:
                    break
                acc += got[1]
            if buf.done():
                a = buf.release()
                results[a] = acc
        for a, r in results.items():  # every delivered result is the whole original window
            assert r == sum(vals[x] for x in ts if a <= x <= a + w - 1)
        assert buf.max_held <= buf.bound


def test_out_of_order_and_bad_settings_are_refused() -> None:
    b = LazyWindowBuffer(3, 1)
    b.arrive(5, 1.0)
    with pytest.raises(ValueError, match="timestamp order"):
        b.arrive(5, 1.0)
    with pytest.raises(ValueError):
        LazyWindowBuffer(0, 1)
    with pytest.raises(ValueError):
        make("sometimes", 3, 1)
    e = EagerWindowBuffer(3, 1)
    e.arrive(0, 1.0)
    e.commit()
    with pytest.raises(RuntimeError, match="no undo"):
        e.release()


def test_both_buffers_see_the_same_windows_close() -> None:
    """Staleness compares the two on the same inputs: the non-empty windows, closed by the same tuple."""
    rng = random.Random(7)
    lazy, eager, t = LazyWindowBuffer(6, 4), EagerWindowBuffer(6, 4), -1
    for _ in range(300):
        t += 1 if rng.random() < 0.8 else rng.randint(2, 15)
        assert lazy.arrive(t, 1.0) == eager.arrive(t, 1.0)
