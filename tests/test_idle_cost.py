"""Cost at rest of a capture host: an idle host loop waits longer between empty turns (never past its
next timer punctuation, whose timing stays as configured), and the paced generator wakes per few
milliseconds of traffic, not per packet. Real kernel and loop; the producer records what is sent."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from contract import wire
from low_level.capture.ring import Ring
from low_level.capture.sources.generator import RATE_BATCH_S, GeneratorSource
from low_level.host.agent import Agent
from low_level.host.loop import HostLoop
from lowwater_testing.capture import RecordingProducer
from lowwater_testing.queries import spec


def test_idle_wait_grows_and_never_passes_the_next_timer() -> None:
    loop = HostLoop([], "h", None)
    loop.next_timer = [time.monotonic() + 100.0]
    waits = [loop.idle_wait(k) for k in range(12)]
    assert waits[0] == loop.idle_sleep_s and waits == sorted(waits)
    assert max(waits) == loop.idle_sleep_max_s
    loop.next_timer = [time.monotonic() + 0.002]
    assert loop.idle_wait(20) <= 0.002  # the timer's deadline bounds the wait
    loop.next_timer = [time.monotonic() - 1.0]
    assert loop.idle_wait(20) == 0.0  # overdue: turn at once


def _counted_agent(source: dict, interval: str) -> tuple[Agent, RecordingProducer, list[int]]:
    """An agent of one small query on ``source``, and a list whose one item counts its loop turns."""
    q = spec(
        "q",
        group_by=["src_ip"],
        aggregates=[{"fn": "count", "as": "packets"}],
        window={"range": "1s"},
        table=256,
        heartbeat={"interval": interval},
    )
    prod = RecordingProducer()
    agent = Agent([q], source, "idle-host", None, ring_slots=1 << 10, chunk=256, producer=prod)
    turns = [0]
    step = agent.step

    def counted() -> int:
        turns[0] += 1
        return step()

    agent.step = counted  # type: ignore[method-assign]
    return agent, prod, turns


def test_a_quiet_agent_turns_rarely_and_still_punctuates_on_its_timer() -> None:
    interval_s = 0.2
    quiet = {"type": "generator", "groups": 4, "rate": 2, "clock": "wall"}  # a live clock, 2 packets/s
    agent, prod, counter = _counted_agent(quiet, "200ms")
    duration = 3.0
    agent.run(duration_s=duration)
    turns = counter[0]
    marks = [wire.decode(v) for _, _, v in prod.sent]
    marks = [b for b in marks if isinstance(b, wire.Punctuation)]
    # the timer punctuates as configured (every 200 ms once the first packet set a mark: 15, and the
    # on-demand ones) ...
    # (at least 0.3 of the 15: under load 40 the loop got 6, and 0.4 * 3 / 0.2 is 6.000000000000001 in floats)
    assert len(marks) >= int(0.3 * duration / interval_s), len(marks)
    # ... while an empty turn waited up to idle_sleep_max_s (a packet or a timer between): at 0.5 ms per
    # wait it was ~1,850 turns
    assert turns <= duration / agent.idle_sleep_max_s * 3 + 40, turns


def test_paced_generator_wakes_per_batch_of_traffic_not_per_packet() -> None:
    ring = Ring(nslots=1 << 14, snaplen=128)
    src = GeneratorSource(ring, rate=20_000, count=4000, clock="wall")
    pushes = 0
    push = src._push

    def counted(*a, **kw) -> int:
        nonlocal pushes
        pushes += 1
        return push(*a, **kw)

    src._push = counted  # type: ignore[method-assign]
    src.start()
    assert src.join(10) and src.finished
    assert src.stats()["frames_pushed"] == 4000
    batches = 4000 / (20_000 * RATE_BATCH_S)  # 100 wakeups of 40 packets; per packet it was 4000
    assert pushes <= 2 * batches, pushes
    tss = ring.arrays()[4][:4000].astype(np.int64)
    assert np.abs(np.diff(tss) - 50_000).max() <= 1  # each packet keeps its scheduled time (50 us apart)


def test_waker_cuts_a_wait_short_once_per_wake() -> None:
    w = HostLoop([], "h", None).waker
    t0 = time.monotonic()
    assert w.wait(0.05) is False and time.monotonic() - t0 >= 0.04  # nothing written: the full wait
    w.wake()
    w.wake()  # a wake already pending writes nothing more
    t0 = time.monotonic()
    assert w.wait(5.0) is True and time.monotonic() - t0 < 1.0
    assert w.wait(0.01) is False and w.wakes == 1


SEND_ONE = """
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
s.send(bytes.fromhex(sys.argv[2]))
"""


@pytest.mark.netns
def test_an_agent_on_an_idle_interface_waits_for_its_deadlines_and_wakes_for_a_packet(veth_pair) -> None:
    """On an idle AF_PACKET interface the loop turns at its deadlines (timer punctuation, a pane its idle
    mark crosses), not every idle_sleep_max_s; a frame wakes it at once, and a stop ends it at once."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    ns, host, peer = veth_pair
    agent, _, turns = _counted_agent({"type": "afpacket", "interfaces": [host]}, "500ms")
    assert agent.wakes_loop
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    try:
        time.sleep(3.0)
        # deadlines: 2 timer marks and 1 pane a second, a few turns after each; at idle_sleep_max_s it was 60
        assert turns[0] <= 3.0 * 3 * 4, turns[0]
        frame = Ether(src="02:00:00:cc:00:02", dst="02:00:00:cc:00:99") / IP(
            src="10.203.77.2", dst="10.203.77.1"
        )
        t0 = time.monotonic()
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-c",
                SEND_ONE,
                peer,
                bytes(frame / UDP(dport=9)).hex(),
            ],
            check=True,
            timeout=60,
        )
        sent = time.monotonic()
        while agent.records_in() == 0 and time.monotonic() - sent < 10:
            time.sleep(0.005)
        # the kernel hands a partly filled block over after RETIRE_TOV_MS (50 ms), the loop turns then
        assert agent.records_in() == 1 and time.monotonic() - sent < 1.0, time.monotonic() - t0
    finally:
        agent.stopping = True
        agent.waker.wake()
        th.join(10)
    assert not th.is_alive()
