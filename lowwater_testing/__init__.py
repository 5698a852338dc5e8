"""lowwater's test-and-bench kit: what the tests and the benchmarks share, and nothing the product needs.

- ``queries``: queries built in code, validated by the real loader (no inline YAML copies).
- ``traffic``: packet descriptions, the frames built from them, and the oracle over them.
- ``oracle``: the one offline reference (per-pane and per-window aggregates, selects) and the emulated
  capture hosts whose partials and punctuation feed the high level.
- ``frames``: a catalogue of crafted frames (scapy) for the parser and fuzz tests.
- ``capture``: the kernel and an agent's ring driven in process. ``agent``: the agent as a real process.
- ``hosts``: every emulated host's messages, and the offline partition step over them.
- ``topics``: Kafka read back and produced in order. ``spark``: the real job started, its store read back
  and compared with the oracle, ``availableNow`` reads.
- ``joins``, ``flows``: the join and flow-export fixtures. ``store``, ``page``: the serving layer's fixture
  store, the API in a subprocess and headless Chromium.
- ``compose``: the central stack's service names the compose tests share.

The product never imports this package; tests and ``benchmarks/`` import it, never each other.
"""
