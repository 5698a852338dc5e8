"""A veth pair with one end in a network namespace of its own: live capture tests and benches send there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager


class NetnsUnavailable(RuntimeError):
    """This machine cannot make a namespace and veth pair (not root, no iproute2, no permission)."""


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@contextmanager
def veth_pair() -> Iterator[tuple[str, str, str]]:
    """(namespace, host end, peer end): host end here (up, 10.203.77.1/30, no IPv6), peer in a fresh netns;
    both removed on exit. Raises :class:`NetnsUnavailable` saying why when it cannot be made."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("needs root (network namespace + AF_PACKET)")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("needs the iproute2 'ip' command")
    tag = uuid.uuid4().hex[:6]
    ns, host, peer = f"lwns{tag}", f"lwh{tag}", f"lwp{tag}"
    try:
        try:
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
        except subprocess.CalledProcessError as exc:
            msg = exc.stderr.decode().strip()
            raise NetnsUnavailable(f"cannot create a network namespace / veth pair here: {msg}") from exc
        for name, pre in ((host, []), (peer, ["ip", "netns", "exec", ns])):
            _sh(
                *pre,
                sys.executable,
                "-c",
                f"import os; p='/proc/sys/net/ipv6/conf/{name}/disable_ipv6'; "
                "os.path.exists(p) and open(p, 'w').write('1')",
            )
        _sh("ip", "addr", "add", "10.203.77.1/30", "dev", host)
        _sh("ip", "link", "set", host, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", "10.203.77.2/30", "dev", peer)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
        yield ns, host, peer
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host], capture_output=True)
