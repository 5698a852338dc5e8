"""Replay a pcap or pcapng file into a ring (``source.PcapSource``; formats in ``format``, the Numba walkers
in ``walk``).

The file is memory-mapped and walked by Numba kernels, a chunk of records per call, so a replay runs
at memory speed and stop() is still noticed within a few milliseconds.

Formats: classic pcap (microsecond and nanosecond magics, either byte order) and pcapng (sections of
either byte order, several interfaces with ``if_tsresol`` / ``if_tsoffset``, Enhanced, Simple and the
obsolete Packet blocks; other blocks are skipped). Link layers: Ethernet, Linux cooked (SLL, SLL2)
and raw IP; the parser downstream reads Ethernet frames, so the others are rewritten as Ethernet
frames on the way into the ring (``link``). Any other link type is refused when the file is opened.

A damaged file never makes the replay crash or read past the end: it stops at the last good record
and reports why in ``stats()`` (``malformed_tail``, ``malformed_offset``, ``reason``).

Modes:

* ``"fast"``: as fast as the ring accepts. When the ring is full the source waits: a file replay must
  not lose packets (so ``drops`` stays 0).
* ``"paced"``: packets are released following the recorded gaps (divided by ``speed``), and when the
  ring is full they are dropped and counted, like a live capture.

Timestamps are the recorded ones, unless ``rebase_to_now``: then each pass is shifted so that its
first packet carries the wall clock at the start of the pass (and, when paced, later packets follow
at ``gap / speed``). Only then is ``live_clock`` True. With ``mode="fast", loop=True,
rebase_to_now=True`` a pass usually takes less wall time than the capture spans, so the next pass's
timestamps may step back: consumers must tolerate out-of-order time (lowwater's do).

In multi-section pcapng files interface ids restart in each section; frames get ``iface_index +``
the interface's ordinal counted over the whole file (== its id for the usual single section).
"""
