"""A Docker engine and the images the compose files need, on a machine where Docker Hub is unreachable.

Why this exists: the compose test (tests/test_compose.py, ``./lw test-compose``) must run the
operators' files on a real engine in CI, which starts with no daemon running and no registry. So:

* :func:`ensure_dockerd` starts Debian's ``dockerd`` when no daemon answers (and fails with the
  daemon's log when it cannot);
* :func:`build_python_base` makes the Python base image from ``debootstrap --variant=minbase`` and
  ``docker import`` (stands in for ``python:3.11-slim-bookworm``);
* :func:`build_standins` builds local images with the interfaces of ``apache/kafka`` (the broker
  from the Maven jars of :mod:`local_stack.jars`, configured by the same ``KAFKA_*`` environment),
  ``prom/prometheus`` and ``prom/alertmanager`` (Debian's packages); compose picks them up through
  its image variables (:func:`image_env`);
* :func:`extra_ca_certs` is the PEM of the certificates this machine trusts beyond Debian's bundle
  (a TLS-inspecting proxy's CA): the Dockerfile's ``EXTRA_CA_CERTS`` build argument puts them into
  the images, for pip and for Java's truststore (Maven).

Every image is tagged with a hash of its recipe, so a second call costs only ``docker image inspect``.
CLI: ``python -m local_stack.docker_engine`` (start the daemon, build what is missing, print the env).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from local_stack.jars import kafka_broker_jars_dir, state_dir

IMAGES_DIR = Path(__file__).resolve().parent / "images"
DEBIAN_MIRROR = os.environ.get("LOWWATER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_CA_DIR = Path("/usr/share/ca-certificates")
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----")


class DockerError(RuntimeError):
    """The engine could not be started or an image could not be built."""


def _log(msg: str) -> None:
    print(f"docker-engine: {msg}", file=sys.stderr, flush=True)


def docker_env() -> dict[str, str]:
    """Environment for docker / docker-compose: the classic builder (no buildx here)."""
    env = dict(os.environ)
    env.setdefault("DOCKER_BUILDKIT", "0")
    env.setdefault("COMPOSE_DOCKER_CLI_BUILD", "0")
    return env


def _docker(
    *args: str, check: bool = True, capture: bool = True, **kw: object
) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], capture_output=capture, text=True, env=docker_env(), **kw)  # type: ignore[call-overload]
    if check and proc.returncode != 0:
        raise DockerError(
            f"docker {' '.join(args[:3])} ... failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc


def daemon_up() -> bool:
    """True when a Docker daemon answers on the default socket."""
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, env=docker_env()).returncode == 0


def ensure_dockerd(timeout: float = 90.0) -> None:
    """Start ``dockerd`` (as root, log under the state dir) unless a daemon already answers."""
    if daemon_up():
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerError("no Docker daemon runs and `dockerd` is not installed: run ./lw setup (docker.io)")
    if shutil.which("docker") is None:
        raise DockerError("the `docker` client is not installed: run ./lw setup (docker.io)")
    if os.geteuid() != 0:
        raise DockerError("no Docker daemon runs and starting dockerd needs root")
    log = state_dir() / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    _log(f"starting dockerd (log: {log})")
    with open(log, "ab") as fh:
        # its own session: the daemon outlives this process (the layer cache and the next test reuse it)
        subprocess.Popen([dockerd], stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon_up():
            return
        time.sleep(1)
    tail = log.read_text(errors="replace")[-3000:]
    raise DockerError(f"dockerd did not answer within {timeout:.0f} s; end of {log}:\n{tail}")


def image_exists(tag: str) -> bool:
    return _docker("image", "inspect", tag, check=False).returncode == 0


def _recipe_hash(*parts: bytes | str | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            for f in sorted(part.rglob("*")) if part.is_dir() else [part]:
                if f.is_file():
                    h.update(str(f.relative_to(part) if part.is_dir() else f.name).encode())
                    h.update(f.read_bytes())
        else:
            h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()[:12]


def extra_ca_certs() -> str:
    """PEM of the certificates in this machine's bundle that Debian's ca-certificates does not ship."""
    if not HOST_CA_BUNDLE.exists():
        return ""
    norm = lambda pem: re.sub(r"\s+", "", pem)  # noqa: E731
    debian = {
        norm(m) for f in DEBIAN_CA_DIR.rglob("*.crt") for m in _PEM.findall(f.read_text(errors="replace"))
    }
    extra = [m for m in _PEM.findall(HOST_CA_BUNDLE.read_text(errors="replace")) if norm(m) not in debian]
    return "\n".join(extra) + ("\n" if extra else "")


def build_python_base() -> str:
    """``python:3.11-slim-bookworm`` stand-in: debootstrap minbase + python3, imported as an image."""
    tag = f"lowwater-standin/python:3.11-bookworm-{_recipe_hash(DEBIAN_MIRROR, *BASE_PACKAGES, 'v1')}"
    if image_exists(tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise DockerError("debootstrap is not installed: run ./lw setup")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lowwater-rootfs-", dir=state_dir()) as tmp:
        root = Path(tmp) / "rootfs"
        _log(f"debootstrap bookworm -> {tag} (a few minutes, once)")
        proc = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(root),
                DEBIAN_MIRROR,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise DockerError(
                f"debootstrap failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        mirror = DEBIAN_MIRROR.rsplit("/debian", 1)[0]
        (root / "etc/apt/sources.list").write_text(
            f"deb {DEBIAN_MIRROR} bookworm main\ndeb {DEBIAN_MIRROR} bookworm-updates main\n"
            f"deb {mirror}/debian-security bookworm-security main\n"
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (root / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        _docker(
            "import",
            "--change",
            "ENV LANG=C.UTF-8",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change",
            'CMD ["python3"]',
            "-",
            tag,
            stdin=tar.stdout,
        )
        tar.wait()
    _log(f"{tag} built in {time.monotonic() - t0:.0f} s")
    return tag


def _build(tag: str, context: Path, base: str) -> None:
    t0 = time.monotonic()
    _log(f"building {tag}")
    _docker("build", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(context))
    _log(f"{tag} built in {time.monotonic() - t0:.0f} s")


def build_standins(base: str) -> dict[str, str]:
    """Kafka, Prometheus and Alertmanager stand-ins; returns {compose image variable: tag}."""
    out: dict[str, str] = {}
    jars = kafka_broker_jars_dir()
    for name, var in (
        ("kafka", "KAFKA_IMAGE"),
        ("prometheus", "PROMETHEUS_IMAGE"),
        ("alertmanager", "ALERTMANAGER_IMAGE"),
    ):
        recipe = IMAGES_DIR / name
        extra: tuple[Path, ...] = (jars / "jars.txt",) if name == "kafka" else ()
        tag = f"lowwater-standin/{name}:{_recipe_hash(base, recipe, *extra)}"
        out[var] = tag
        if image_exists(tag):
            continue
        if name == "kafka":
            with tempfile.TemporaryDirectory(prefix="lowwater-kafka-ctx-", dir=state_dir()) as tmp:
                ctx = Path(tmp)
                shutil.copytree(recipe, ctx, dirs_exist_ok=True)
                (ctx / "libs").mkdir()
                for jar in jars.glob("*.jar"):
                    shutil.copy2(jar, ctx / "libs" / jar.name)
                _build(tag, ctx, base)
        else:
            _build(tag, recipe, base)
    return out


def image_env() -> dict[str, str]:
    """Start the engine, build what is missing; the variables that point compose at the images."""
    ensure_dockerd()
    base = build_python_base()
    env = {"PYTHON_IMAGE": base, **build_standins(base)}
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    env: Mapping[str, str] = image_env()
    for k, v in env.items():
        print(f"{k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
