"""Python worker start: time to connect back to Spark's worker factory, plain interpreter vs the launcher.

``.venv/bin/python -m benchmarks.bench_worker_start [--starts 8]`` starts the driver-side worker of
``transformWithStateInPandas`` (``python -m pyspark.sql.streaming.transform_with_state_driver_worker``) the
way ``PythonWorkerFactory.createSimpleWorker`` does (Spark's worker ``PYTHONPATH``, pyspark.zip first; a
listening socket, the secret, the pid), once with this interpreter and once through
``high_level/cluster/pyworker.py``, and prints the seconds until the pid arrives and how many starts exceed Spark's
fixed 10 s. Run it under load (e.g. busy loops on every core) to see what a query start meets. Printed only.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from high_level.cluster.pyworker import DRIVER_WORKER, install

WINDOW_S = 10.0  # PythonWorkerFactory.createSimpleWorker's connect-back timeout


def one_start(exe: str, path: str, timeout_s: float) -> float:
    """Seconds from spawn to the worker's pid after authentication (inf: not within ``timeout_s``)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(timeout_s)
    env = dict(
        os.environ,
        PYTHONPATH=path,
        PYTHON_WORKER_FACTORY_PORT=str(srv.getsockname()[1]),
        PYTHON_WORKER_FACTORY_SECRET="secret",
        PYTHONUNBUFFERED="YES",
    )
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [exe, "-m", DRIVER_WORKER], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        f.read(struct.unpack("!i", f.read(4))[0])
        f.write(struct.pack("!i", 2) + b"ok")
        f.flush()
        f.read(4)
        took = time.perf_counter() - t0
        conn.close()
    except (TimeoutError, struct.error):
        took = float("inf")
    finally:
        p.kill()
        p.wait()
        srv.close()
    return took


def main() -> int:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=8)
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="give up on one start after this many seconds"
    )
    a = ap.parse_args()
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    path = os.pathsep.join(str(p) for p in [lib / "pyspark.zip", *sorted(lib.glob("py4j-*.zip"))])
    execs = {"python": sys.executable, "launcher": install(tempfile.mkdtemp(prefix="lowwater-pyworker-"))}
    times: dict[str, list[float]] = {k: [] for k in execs}
    for i in range(a.starts):
        for name, exe in execs.items():  # interleaved: both meet the same load
            times[name].append(one_start(exe, path, a.timeout))
            print(f"start {i}: {name:8s} {times[name][-1]:.2f} s", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    for name, ts in times.items():
        srt = sorted(ts)
        print(
            f"{name:8s} over {WINDOW_S:.0f} s: {sum(t > WINDOW_S for t in ts)} of {len(ts)}; "
            f"median {srt[len(srt) // 2]:.2f} s, max {srt[-1]:.2f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
