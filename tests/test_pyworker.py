"""The Python worker launcher (high_level/cluster/pyworker.py): workers import the installed pyspark, and the
transformWithStateInPandas driver worker connects back before importing it."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pyspark
import pytest

from high_level.cluster.pyworker import DRIVER_WORKER, install, installed, redundant_zips


def test_only_zips_of_packages_installed_alongside_are_redundant(tmp_path):
    site = tmp_path / "site"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    other = [str(tmp_path / "elsewhere" / "python" / "lib" / "pyspark.zip"), str(tmp_path / "app.zip"), ""]
    assert redundant_zips(zips + other) == {zips[0]}  # py4j not installed: its zip stays
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    assert redundant_zips(zips + other) == set(zips)


def _factory(secret: bytes) -> tuple[socket.socket, dict[str, str]]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(120)
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    path = os.pathsep.join(str(p) for p in [lib / "pyspark.zip", *lib.glob("py4j-*.zip")])  # what Spark sets
    env = dict(
        os.environ,
        PYTHONPATH=path,
        PYTHON_WORKER_FACTORY_PORT=str(srv.getsockname()[1]),
        PYTHON_WORKER_FACTORY_SECRET=secret.decode(),
    )
    return srv, env


@pytest.mark.parametrize("launcher", ["state-script", "console-script"])
def test_driver_worker_connects_authenticates_and_sends_its_pid(tmp_path, launcher):
    """The protocol of PythonWorkerFactory.createSimpleWorker against the real launcher script (where the
    worker's modules come from: test_spark_python_workers_run_through_the_launcher): the one a local
    master writes, and the console script a cluster's driver and workers share (spark:// masters)."""
    if launcher == "state-script":
        exe = install(tmp_path)
        assert Path(exe).read_text().startswith(f"#!{sys.executable}\n") and os.access(exe, os.X_OK)
    else:
        exe = installed()
        assert exe is not None, "no lowwater-python-worker console script: ./lw setup (pip install -e .)"
    srv, env = _factory(b"s3cret")
    proc = subprocess.Popen(
        [exe, "-m", DRIVER_WORKER], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        n = struct.unpack("!i", f.read(4))[0]
        assert f.read(n) == b"s3cret"
        f.write(struct.pack("!i", 2) + b"ok")
        f.flush()
        assert struct.unpack("!i", f.read(4))[0] == proc.pid
        conn.close()
    finally:
        proc.kill()
        proc.wait()
        srv.close()


def test_wrong_reply_is_an_error_not_a_silent_worker(tmp_path):
    from high_level.cluster.pyworker import connect_back

    srv, _ = _factory(b"x")

    def reply() -> None:
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        f.read(4 + 1)
        f.write(struct.pack("!i", 2) + b"no")
        f.flush()

    t = threading.Thread(target=reply)
    t.start()
    with pytest.raises(ConnectionError, match="unexpected reply"):
        connect_back(srv.getsockname()[1], "x")
    t.join()
    srv.close()


def test_spark_python_workers_run_through_the_launcher(spark):
    """The session's workers (local master) use the launcher and import pyspark from the installed package."""
    assert spark.sparkContext.pythonExec.endswith("python-worker")
    files = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()
    assert files == [pyspark.__file__]
