"""The flow collector's batched receive on a real loopback socket: gathering a batch over several recvmmsg
calls (naps between them) must lose nothing, cut nothing, keep the order and come back promptly when the
export pauses (bounded latency); what the socket's buffer drops is counted, never silent."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from low_level.flows.receive import BatchReceiver, socket_drops


def _pair(
    vlen: int, gap_s: float, rcvbuf: int = 1 << 22
) -> tuple[socket.socket, BatchReceiver, socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    return rx, BatchReceiver(rx, vlen, gap_s=gap_s), tx


def _payload(i: int) -> bytes:
    return i.to_bytes(4, "big") * (10 + i % 50)  # 40 .. 236 bytes, each datagram its own


def _taken(r: BatchReceiver, got: int) -> list[bytes]:
    return [bytes(r.buf[k * r.slot : k * r.slot + int(r.lens[k])]) for k in range(got)]


def test_gathering_loses_nothing_across_batches_and_pauses() -> None:
    """3,000 datagrams in bursts of 100 with pauses longer than the gap: every one arrives once, whole, in
    order, however the calls cut the stream; a full batch returns at once, not at its wait."""
    rx, r, tx = _pair(vlen=64, gap_s=0.02)
    sent = 3000

    def export() -> None:
        for i in range(sent):
            tx.send(_payload(i))
            if i % 100 == 99:
                time.sleep(0.03)  # the export pauses: the receive returns what it has

    try:
        t = threading.Thread(target=export)
        t.start()
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(seen) < sent and time.monotonic() < deadline:
            seen += _taken(r, r.receive(wait_s=5.0))
        t.join()
        assert seen == [_payload(i) for i in range(sent)]
        assert socket_drops(rx) == 0
        # a batch already waiting comes back whole at once, without its 5 s wait
        for i in range(64):
            tx.send(_payload(i))
        t0 = time.monotonic()
        assert r.receive(wait_s=5.0) == 64 and time.monotonic() - t0 < 2.5
        assert _taken(r, 64) == [_payload(i) for i in range(64)]
    finally:
        rx.close()
        tx.close()


@pytest.mark.parametrize("wait_s", [0.0, 5.0])
def test_a_paused_export_returns_promptly(wait_s: float) -> None:
    """A partial batch and then silence: the call returns the datagrams it has once no more came for the
    gap (50 ms), long before its 5 s wait; on a silent socket it returns 0 as soon (no wait: at once)."""
    rx, r, tx = _pair(vlen=1024, gap_s=0.05)
    try:
        t0 = time.monotonic()
        assert r.receive(wait_s=wait_s) == 0
        assert time.monotonic() - t0 < 2.5
        for i in range(10):
            tx.send(_payload(i))
        t0 = time.monotonic()
        got = r.receive(wait_s=wait_s)
        took = time.monotonic() - t0
        assert got == 10 and took < 2.5, (got, took)
        assert _taken(r, got) == [_payload(i) for i in range(10)]
    finally:
        rx.close()
        tx.close()


def test_a_steady_export_is_returned_within_the_wait() -> None:
    """Datagrams that never pause for the gap, but fill no batch: the call still returns once its wait has
    passed, so no record waits much longer than the wait."""
    rx, r, tx = _pair(vlen=4096, gap_s=0.2)
    stop = threading.Event()

    def export() -> None:
        i = 0
        while not stop.is_set():
            tx.send(_payload(i))
            i += 1
            time.sleep(0.002)

    t = threading.Thread(target=export)
    try:
        t.start()
        r.receive(wait_s=0.3)  # the export is flowing from here on
        t0 = time.monotonic()
        got = r.receive(wait_s=0.3)
        took = time.monotonic() - t0
        assert 0 < got < 4096 and took < 3.0, (got, took)
    finally:
        stop.set()
        t.join()
        rx.close()
        tx.close()


def test_what_the_socket_buffer_drops_is_counted() -> None:
    """A socket buffer too small for the burst: what the kernel could not queue is counted (SO_MEMINFO's
    drops), so received + dropped = sent."""
    rx, r, tx = _pair(vlen=1024, gap_s=0.02, rcvbuf=4096)
    try:
        for i in range(200):
            tx.send(_payload(i))
        got = 0
        while n := r.receive():
            got += n
        assert 0 < got < 200 and got + socket_drops(rx) == 200
    finally:
        rx.close()
        tx.close()


def test_the_collector_reports_its_socket_drops_also_after_close() -> None:
    """The flow collector's stats carry the socket's drops (``kernel_drops``: the host loop charges them to
    panes as socket losses), still readable once the socket is closed."""
    from low_level.flows.source import FlowCollector

    col = FlowCollector(batch=1024).open()
    assert col.sock is not None
    col.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(200):
            tx.sendto(_payload(i), ("127.0.0.1", col.port))
        drops = col.stats()["kernel_drops"]
        assert 0 < drops < 200
        col.close()
        assert col.stats()["kernel_drops"] == drops
    finally:
        col.close()
        tx.close()
