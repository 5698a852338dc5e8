"""Python worker launcher: Spark's Python workers import the installed pyspark, not ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python worker's
``PYTHONPATH``. Modules imported from a zip have no bytecode cache, so each worker compiles pyspark's
modules from source: ~0.9 s of CPU instead of ~0.2 s for the driver-side worker of
``transformWithStateInPandas`` (``pyspark.sql.streaming.transform_with_state_driver_worker``, started
at every query start to validate the state schema). That worker must connect back within a fixed 10 s
(``PythonWorkerFactory.createSimpleWorker``, not configurable); on a 2-core machine at load ~20 a
process gets ~1/10 of a core and the compile alone takes ~9 s, so query starts failed with
``Python worker failed to connect back``. Where the zip lies inside the installed pyspark package
(a pip install: the same files, with ``__pycache__``), dropping it from the path changes no code.
That alone is not enough at load ~35 (3 of 8 starts still took over 10 s), so for that one module the
launcher also connects back and authenticates first, with the standard library only (the protocol of
``pyspark.util.local_connect_and_auth`` and ``worker_util.get_sock_file_to_executor``: secret with its
length, ``ok``, the pid), and imports pyspark afterwards: the JVM waits without a time limit once the
worker is connected.

:func:`install` writes an executable ``python-worker`` script (shebang: this interpreter) that runs
:func:`main`; the session hands it to Spark as the workers' Python on a local master. On a cluster
(``spark://``) the driver-side worker above starts on the driver's machine under the same load, and
the executors' daemons too, but a file of this machine's state directory is not on the workers: there
the session names the ``lowwater-python-worker`` console script (:func:`installed`), which every
install of the package has at the same path (the images of the driver and the workers are one).
:func:`main` cleans the path and runs ``-m MODULE`` as Python would.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import socket
import struct
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# the driver-side worker of transformWithStateInPandas: a simple worker with a 10-s connect-back window
DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"

_SCRIPT = """#!{python}
# written by high_level.cluster.pyworker: Spark's Python workers without pyspark.zip on their path
import sys
sys.path.insert(0, {root!r})
from high_level.cluster.pyworker import main
main()
"""


def redundant_zips(entries: list[str]) -> set[str]:
    """The entries of ``entries`` that are Spark's bundled zips of a package installed alongside:
    ``<site>/pyspark/python/lib/{pyspark.zip, py4j-*.zip}`` when ``<site>/pyspark`` (resp. ``<site>/py4j``)
    is an installed package."""
    out = set()
    for e in entries:
        p = Path(e)
        if p.suffix != ".zip" or p.parent.name != "lib" or p.parent.parent.name != "python":
            continue
        pkg_dir = p.parent.parent.parent  # <site>/pyspark
        site = pkg_dir.parent
        if p.name == "pyspark.zip" and (pkg_dir / "__init__.py").is_file():
            out.add(e)
        elif p.name.startswith("py4j-") and (site / "py4j" / "__init__.py").is_file():
            out.add(e)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run ``-m MODULE [ARGS]`` (what Spark asks of its Python) without the redundant zips."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])  # not a worker start: plain Python
    drop = redundant_zips(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    if drop:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            e for e in os.environ["PYTHONPATH"].split(os.pathsep) if e not in drop
        )
        sys.path[:] = [e for e in sys.path if e not in drop]
    module = args[1]
    env = os.environ
    if (
        module == DRIVER_WORKER
        and "PYTHON_WORKER_FACTORY_PORT" in env
        and "PYTHON_WORKER_FACTORY_SOCK_PATH" not in env
    ):
        sock, sock_file = connect_back(
            int(env["PYTHON_WORKER_FACTORY_PORT"]), env["PYTHON_WORKER_FACTORY_SECRET"]
        )
        import pyspark.worker_util  # now the heavy imports: the JVM has its worker

        @contextlib.contextmanager
        def connected(timeout: int | None = -1) -> Iterator[IO[bytes]]:
            if timeout is None or timeout > 0:
                sock.settimeout(timeout)
            try:
                yield sock_file
            finally:
                sock_file.close()

        pyspark.worker_util.get_sock_file_to_executor = connected
    sys.argv = [module, *args[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def connect_back(port: int, secret: str) -> tuple[socket.socket, Any]:
    """Connect to the JVM's worker factory and authenticate, as ``pyspark.util.local_connect_and_auth``
    does, then send the pid (``get_sock_file_to_executor``): (socket, its buffered file)."""
    addr = "::1" if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
    errors = []
    for af, kind, proto, _, sa in socket.getaddrinfo(addr, port, socket.AF_UNSPEC, socket.SOCK_STREAM):
        sock = socket.socket(af, kind, proto)
        try:
            sock.settimeout(int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15)))
            sock.connect(sa)
            f = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
            key = secret.encode("utf-8")
            f.write(struct.pack("!i", len(key)) + key)
            f.flush()
            n = struct.unpack("!i", f.read(4))[0]
            if f.read(n).decode("utf-8") != "ok":
                raise ConnectionError("unexpected reply from the JVM's worker factory")
            f.write(struct.pack("!i", os.getpid()))
            f.flush()
            return sock, f
        except (OSError, struct.error) as exc:
            errors.append(f"{sa}: {exc}")
            sock.close()
    raise ConnectionError(f"cannot connect back to the JVM: {errors}")


CONSOLE_SCRIPT = "lowwater-python-worker"  # pyproject.toml [project.scripts]: runs main()


def installed() -> str | None:
    """The package's launcher console script, if this interpreter's install has it (a cluster's
    workers then find it at the same path); None otherwise."""
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        path = Path(scripts) / CONSOLE_SCRIPT
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def install(directory: Path | str) -> str:
    """Write the launcher script into ``directory`` (atomically) and return its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "python-worker"
    text = _SCRIPT.format(python=sys.executable, root=str(Path(__file__).resolve().parents[2]))
    if not path.is_file() or path.read_text() != text:
        tmp = d / f".python-worker.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return str(path)
