"""Exec a command with environment variables read from files (compose/Docker secrets).

Usage: ``python /app/deploy/docker/env_from_files.py VAR=/run/secrets/FILE [VAR=FILE ...] -- CMD [ARG ...]``

Why: ``lowwater-api`` takes its token from ``--token`` or ``LOWWATER_API_TOKEN``; putting the token in
the compose environment would show it in ``docker inspect`` and keep a second copy next to the one
Prometheus needs (as a file) to scrape the API's protected ``/metrics``. With this wrapper the token
exists once, in the secret file both containers mount. Trailing whitespace (the newline of
``echo ... > file``) is stripped; a missing, unreadable or empty file is an error (exit 2), so the API
never starts unprotected by accident.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def read_env_files(specs: Sequence[str]) -> dict[str, str]:
    """``["VAR=/path", ...]`` -> ``{"VAR": <file content, stripped>}``; raises ValueError naming the problem."""
    out: dict[str, str] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq or not _NAME.fullmatch(name) or not path:
            raise ValueError(f"{spec!r} is not VAR=/path/to/file")
        try:
            with open(path, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError as exc:
            raise ValueError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
        if not value:
            raise ValueError(f"{name}: {path} is empty")
        out[name] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or args.index("--") == len(args) - 1:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    cut = args.index("--")
    try:
        env = read_env_files(args[:cut])
    except ValueError as exc:
        print(f"env_from_files: {exc}", file=sys.stderr)
        return 2
    cmd = args[cut + 1 :]
    os.environ.update(env)
    os.execvp(cmd[0], cmd)  # noqa: S606 - replaces this process: the command gets the signals, the pid
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
