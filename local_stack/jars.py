"""Fetch the Java jars the local stack needs (Kafka broker, Spark's Kafka source) with Maven.

Why Maven and not Spark's ``spark.jars.packages``: Spark's Ivy resolution cannot be relied on
here, while ``mvn dependency:copy-dependencies`` against the poms in ``local_stack/maven`` is
verified to work. Each jar set lands in its own directory under the state dir, with a stamp
holding the hash of its pom, so a second call costs nothing (``python -m local_stack.jars``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MAVEN_DIR = Path(__file__).resolve().parent / "maven"
KAFKA_POM = MAVEN_DIR / "kafka-broker.pom.xml"
SPARK_KAFKA_POM = MAVEN_DIR / "spark-kafka.pom.xml"

# Kafka's published pom still declares slf4j-api 1.7.36 (its binary distribution ships 2.0.x);
# slf4j 1.7 cannot find the log4j-slf4j2-impl provider and silently drops every broker log line.
# These artifacts replace whatever version Maven resolved for the same groupId:artifactId.
# (Better fixed in kafka-broker.pom.xml with a direct slf4j-api 2.0.x dependency; then drop this.)
KAFKA_OVERRIDES: tuple[str, ...] = ("org.slf4j:slf4j-api:2.0.17",)

_STAMP = ".stamp"
_MANIFEST = "jars.txt"  # one "groupId:artifactId:version<TAB>file name" line per jar
_LAYOUT_VERSION = "1"  # bump when the directory layout written here changes


@dataclass(frozen=True)
class Jar:
    """One fetched jar and the Maven coordinates it came from."""

    group: str
    artifact: str
    version: str
    path: Path


def state_dir() -> Path:
    """The root of everything generated at run time ($LOWWATER_STATE_DIR or <repo>/.state)."""
    env = os.environ.get("LOWWATER_STATE_DIR")
    return Path(env).resolve() if env else REPO_ROOT / ".state"


def jars_root() -> Path:
    """Where the jar sets live; shared by every broker and Spark session of this checkout."""
    return state_dir() / "jars"


def _stamp_for(pom: Path, overrides: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(pom.read_bytes())
    h.update(("\n".join(overrides) + "\n" + _LAYOUT_VERSION).encode())
    return h.hexdigest()


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """Serialise fetches of one jar set between processes (e.g. two pytest runs)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is needed to fetch the Kafka/Spark jars; run ./lw setup (apt-get install maven)"
        )
    return mvn


def _run_mvn(args: list[str]) -> None:
    cmd = [_mvn(), "-q", "-B", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip().splitlines()
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n" + "\n".join(out[-40:]))


def _parse_dependency_list(text: str) -> list[tuple[str, str, str, str | None]]:
    """(group, artifact, version, classifier) of the jar lines of `mvn dependency:list` output."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split(" ")[0].split(":")
        if len(parts) == 5:
            group, artifact, typ, version, _scope = parts
            classifier = None
        elif len(parts) == 6:
            group, artifact, typ, classifier, version, _scope = parts
        else:
            continue
        if typ == "jar":
            out.append((group, artifact, version, classifier))
    return out


def _fill(pom: Path, tmp: Path, overrides: Sequence[str]) -> None:
    listing = tmp / "dependency-list.txt"
    _run_mvn(
        [
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "dependency:list",
            f"-DoutputDirectory={tmp}",
            "-DincludeScope=runtime",
            f"-DoutputFile={listing}",
        ]
    )
    coords = {(g, a): (v, c) for g, a, v, c in _parse_dependency_list(listing.read_text())}
    listing.unlink()
    for spec in overrides:
        g, a, v = spec.split(":")
        old = coords.pop((g, a), None)
        if old is not None:
            (tmp / _file_name(a, *old)).unlink(missing_ok=True)
        _run_mvn(
            ["-f", str(pom), "dependency:copy", f"-Dartifact={g}:{a}:{v}:jar", f"-DoutputDirectory={tmp}"]
        )
        coords[(g, a)] = (v, None)
    lines = []
    for (g, a), (v, c) in sorted(coords.items()):
        name = _file_name(a, v, c)
        if not (tmp / name).is_file():
            raise RuntimeError(f"Maven listed {g}:{a}:{v} but {name} was not copied into {tmp}")
        lines.append(f"{g}:{a}:{v}\t{name}\n")
    (tmp / _MANIFEST).write_text("".join(lines))


def _file_name(artifact: str, version: str, classifier: str | None) -> str:
    return f"{artifact}-{version}{'-' + classifier if classifier else ''}.jar"


def fetch_jar_set(pom: Path, dest: Path, overrides: Sequence[str] = (), force: bool = False) -> Path:
    """Copy the runtime jars of ``pom`` into ``dest`` unless its stamp already matches; return ``dest``."""
    stamp = _stamp_for(pom, overrides)
    with _locked(dest):
        stamp_file = dest / _STAMP
        if not force and stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
            return dest
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _fill(pom, tmp, overrides)
            (tmp / _STAMP).write_text(stamp + "\n")
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def read_jar_set(dest: Path) -> list[Jar]:
    """The jars recorded in a fetched set's manifest, in a stable order."""
    jars = []
    for line in (dest / _MANIFEST).read_text().splitlines():
        coord, name = line.split("\t")
        g, a, v = coord.split(":")
        jars.append(Jar(g, a, v, dest / name))
    return jars


def kafka_broker_jars_dir(force: bool = False) -> Path:
    """Directory holding the Kafka broker's classpath (use it as ``<dir>/*``)."""
    return fetch_jar_set(KAFKA_POM, jars_root() / "kafka", KAFKA_OVERRIDES, force=force)


def pyspark_jars_dir() -> Path:
    """The jars directory of the installed pyspark (what Spark already has on its classpath)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed in this interpreter; run ./lw setup")
    return Path(spec.origin).parent / "jars"


def _shipped(artifact: str, names: Sequence[str]) -> bool:
    prefix = artifact + "-"
    return any(n.startswith(prefix) and n[len(prefix) : len(prefix) + 1].isdigit() for n in names)


def spark_kafka_jars(force: bool = False) -> list[str]:
    """Absolute paths of the Kafka-source jars to hand Spark via ``spark.jars``.

    Jars whose artifact pyspark already ships (in any version: scala-library, lz4-java,
    snappy-java, ...) are left out so that two versions of one library never meet on the
    classpath.
    """
    dest = fetch_jar_set(SPARK_KAFKA_POM, jars_root() / "spark-kafka", force=force)
    shipped = [p.name for p in pyspark_jars_dir().glob("*.jar")]
    return [str(j.path) for j in read_jar_set(dest) if not _shipped(j.artifact, shipped)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: fetch both jar sets (idempotent) and print where they are."""
    parser = argparse.ArgumentParser(prog="python -m local_stack.jars", description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="fetch again even if the stamps match")
    parser.add_argument(
        "--spark-list",
        action="store_true",
        help="print only the Spark Kafka jars as a comma list (for lowwater-job --spark-jars)",
    )
    args = parser.parse_args(argv)
    if args.spark_list:
        print(",".join(spark_kafka_jars(force=args.force)))
        return 0
    kafka_dir = kafka_broker_jars_dir(force=args.force)
    print(f"kafka broker jars: {kafka_dir} ({len(read_jar_set(kafka_dir))} jars)")
    spark = spark_kafka_jars(force=args.force)
    print(f"spark kafka jars ({len(spark)} not shipped by pyspark): " + " ".join(Path(p).name for p in spark))
    return 0


if __name__ == "__main__":
    sys.exit(main())
