"""Container health check of the lowwater image: exit 0 when the role's endpoint answers.

Usage: ``python /app/deploy/docker/healthcheck.py [URL ...]`` (default: ``$LOWWATER_HEALTH_URL``,
else the agent's ``http://127.0.0.1:9101/metrics``). An ``http(s)://`` URL must answer 2xx within
the timeout; ``tcp://host:port`` only has to accept a connection (Spark master RPC port). Every
URL given must pass. Standard library only, so it runs in any role without extra packages.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:9101/metrics"
TIMEOUT_S = 4.0


def check(url: str, timeout: float = TIMEOUT_S) -> str | None:
    """None if ``url`` is healthy, else a one-line reason."""
    parts = urlsplit(url)
    if parts.scheme == "tcp":
        if not parts.hostname or not parts.port:
            return f"{url}: tcp URLs need host and port"
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
                return None
        except OSError as exc:
            return f"{url}: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"{url}: unsupported scheme {parts.scheme!r} (use http, https or tcp)"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - scheme checked above
            status = resp.status
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"
    return None if 200 <= status < 300 else f"{url}: HTTP {status}"


def main(argv: Sequence[str] | None = None) -> int:
    urls = list(sys.argv[1:] if argv is None else argv) or [
        os.environ.get("LOWWATER_HEALTH_URL") or DEFAULT_URL
    ]
    failures = [reason for reason in map(check, urls) if reason]
    for reason in failures:
        print(f"unhealthy: {reason}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
