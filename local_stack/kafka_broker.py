"""A real single-node Kafka broker (KRaft, combined broker+controller) on 127.0.0.1.

Why a real broker: the capture agent and the Spark job meet only through Kafka's wire protocol,
offsets and partitions, so tests (including fault tests that SIGKILL the broker) run against
the genuine thing, started from the jars that :mod:`local_stack.jars` fetched.

Layout under ``<state>/kafka/<name>/``: ``server.properties``, ``log4j2.xml``, ``data/``
(``log.dirs``), ``logs/server.log`` (log4j), ``logs/stdout.log`` (the JVM's own output),
``broker.pid`` and ``broker.json`` (the ports, so that a later start reuses them).

Security (optional, off by default): ``sasl_users`` turns the client listener into SASL with the PLAIN
mechanism, ``tls=True`` into TLS with a throwaway CA made by ``keytool`` under ``tls/`` (``ca.pem``
is what clients trust); both together give SASL_SSL; ``acls=True`` enforces Kafka ACLs.
:meth:`KafkaBroker.client_security` and :meth:`KafkaBroker.spark_kafka_options` say how a
kafka-python client and Spark's Kafka source reach it. With any of them, ``server.properties``
(passwords inside) is made readable by its owner only.

CLI for humans: ``python -m local_stack.kafka_broker start|stop|status [--name N] [--port P]
[--sasl-user NAME=PASSWORD ...] [--tls] [--acls]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from contract.kafka_security import KafkaSecurity, check_sasl_credentials
from local_stack.jars import kafka_broker_jars_dir, state_dir

DEFAULT_PORT = 9092
NODE_ID = 1
MIN_JAVA = 17  # Kafka 4.x brokers need Java 17+
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


class KafkaBrokerError(RuntimeError):
    """The broker could not be started, reached or stopped."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's ephemeral range.

    A port the kernel hands out for bind(0) is also one it hands to outgoing connections: picked minutes before a
    container publishes it, a client socket took it meanwhile (CI: "bind: address already in use"). Ports under the
    ephemeral range are only ever taken by listeners, so a free one stays free until someone means to use it.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = secrets.randbelow(max(low - 20000, 1)) + 20000
        if port < low and not _port_in_use(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM does, ignoring TIME_WAIT
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def java_executable() -> str:
    """Path of a Java 17+ ``java``; raises with a clear message when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = (
        str(Path(home) / "bin" / "java")
        if home and (Path(home) / "bin" / "java").exists()
        else shutil.which("java")
    )
    if java is None:
        raise KafkaBrokerError(
            f"Java {MIN_JAVA}+ is required for the Kafka broker but `java` is not on PATH; "
            "run ./lw setup (installs openjdk-17-jre-headless)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if m is None:
        raise KafkaBrokerError(f"could not read the Java version from `{java} -version`: {out.strip()!r}")
    major = int(m.group(2)) if m.group(1) == "1" else int(m.group(1))  # "1.8.0" style means 8
    if major < MIN_JAVA:
        raise KafkaBrokerError(
            f"Java {MIN_JAVA}+ is required for the Kafka broker, {java} is Java {major}; "
            "run ./lw setup or point JAVA_HOME at a newer JDK"
        )
    return java


def plain_jaas_config(username: str, password: str, **users: str) -> str:
    """A ``sasl.jaas.config`` value for the PLAIN mechanism (client side; ``users``: the broker's table).

    Names and passwords are checked by :func:`check_sasl_credentials`: the JAAS parser would read a
    quote or backslash in a password as syntax.
    """
    check_sasl_credentials({username: password, **users})
    table = "".join(f' user_{name}="{pw}"' for name, pw in users.items())
    return f'{PLAIN_LOGIN_MODULE} required username="{username}" password="{password}"{table};'


def _kafka_uuid() -> str:
    """A cluster id in Kafka's format (url-safe base64 of 16 random bytes, no padding)."""
    while True:
        s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not s.startswith("-"):  # Kafka's Uuid.randomUuid avoids these too: they read as CLI flags
            return s


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class TopicMismatch(KafkaBrokerError):
    """A topic exists with another partition count than asked for."""

    def __init__(self, topic: str, have: int | None, want: int, broker: KafkaBroker) -> None:
        self.topic, self.have, self.want = topic, have, want
        super().__init__(
            f"topic {topic!r} already exists on broker {broker.name!r} with {have} partitions, but "
            f"{want} are configured: reset the local broker (`./lw run --fresh` deletes its data) "
            f"or set kafka.partitions back to {have}"
        )


class KafkaBroker:
    """One KRaft broker+controller process, its config and its data directory.

    ``port=None`` reuses the ports recorded by an earlier start of the same ``name`` (else 9092),
    ``port=0`` picks a free port (what tests do). The controller listens on ``controller_port``
    (default: ``port + 1`` for a given port, a free port otherwise). With ``die_with_parent`` the
    broker gets SIGTERM when the Python thread that started it dies, so a crashed test run leaves
    no broker behind; the CLI turns it off so the broker outlives ``start``.

    Client-listener security (the controller listener stays PLAINTEXT on 127.0.0.1 either way):

    * ``sasl_users`` (name -> password): SASL with the PLAIN mechanism; the broker's JAAS table
      (``listener.name.<listener>.plain.sasl.jaas.config``) accepts exactly these users. The listener
      is also the inter-broker listener, as ``admin_user`` (default: the first user); the health check
      and :meth:`create_topic` authenticate as that user too.
    * ``tls``: TLS with a broker certificate for ``IP:127.0.0.1``/``DNS:localhost``, signed by a CA
      made on first start under ``<base>/tls`` and kept across restarts; clients trust
      :attr:`ca_file` (PEM). The CA's private key is deleted once the broker certificate is signed.
    * ``acls`` (needs ``sasl_users``): the KRaft ``StandardAuthorizer``; nothing is allowed without
      an ACL except to the super users ``admin_user`` and ``ANONYMOUS``. ``ANONYMOUS`` is the
      principal of the PLAINTEXT controller listener, over which the broker registers with its own
      controller: without it the broker never becomes ready. That listener is on 127.0.0.1 only,
      so this is for local tests; a real deployment authenticates its controller listener too.

    The listener is named after its protocol: PLAINTEXT (the default, as before), SASL_PLAINTEXT,
    SSL or SASL_SSL. ``extra_config`` is applied last and overrides any of it.
    """

    def __init__(
        self,
        name: str = "default",
        port: int | None = None,
        *,
        controller_port: int | None = None,
        state: Path | str | None = None,
        heap: str = "512m",
        extra_config: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
        sasl_users: Mapping[str, str] | None = None,
        admin_user: str | None = None,
        tls: bool = False,
        acls: bool = False,
    ) -> None:
        self.name = name
        self.base_dir = Path(state or state_dir()) / "kafka" / name
        self.data_dir = self.base_dir / "data"
        self.log_dir = self.base_dir / "logs"
        self.properties_path = self.base_dir / "server.properties"
        self.log4j_path = self.base_dir / "log4j2.xml"
        self.pid_path = self.base_dir / "broker.pid"
        self.info_path = self.base_dir / "broker.json"
        self.heap = heap
        self.extra_config = dict(extra_config or {})
        self.die_with_parent = die_with_parent
        self.sasl_users = dict(sasl_users or {})
        if sasl_users is not None and not self.sasl_users:
            raise ValueError("sasl_users is empty: give at least one user, or None for no SASL")
        check_sasl_credentials(self.sasl_users)
        self.admin_user = admin_user or next(iter(self.sasl_users), None)
        if self.sasl_users and self.admin_user not in self.sasl_users:
            raise ValueError(f"admin_user {admin_user!r} is not one of sasl_users {sorted(self.sasl_users)}")
        if admin_user and not self.sasl_users:
            raise ValueError("admin_user needs sasl_users")
        self.tls = bool(tls)
        self.acls = bool(acls)
        if self.acls and not self.sasl_users:
            raise ValueError("acls needs sasl_users: ACLs name authenticated principals")
        self.tls_dir = self.base_dir / "tls"
        self._proc: subprocess.Popen[bytes] | None = None
        stored = self._stored_ports() if port is None else None
        if stored is not None:
            self.port, self.controller_port = stored
        elif port == 0:
            self.port = free_port()
            self.controller_port = controller_port or free_port()
        else:
            self.port = port or DEFAULT_PORT
            self.controller_port = controller_port or self.port + 1

    # -- public API -------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """What clients pass as ``bootstrap_servers`` / ``kafka.bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    @property
    def security_protocol(self) -> str:
        """The client listener's protocol (and name): PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL."""
        return ("SASL_" if self.sasl_users else "") + ("SSL" if self.tls else "PLAINTEXT")

    @property
    def ca_file(self) -> Path:
        """PEM certificate of the CA that signed the broker's certificate (only with ``tls``)."""
        return self.tls_dir / "ca.pem"

    def security(self, user: str | None = None, password: str | None = None) -> KafkaSecurity:
        """The Kafka security block (what every lowwater role takes) to connect as ``user``.

        ``user`` defaults to ``admin_user``, ``password`` to the user's password in ``sasl_users``
        (pass one to try a wrong one). PLAINTEXT for a PLAINTEXT broker.
        """
        if self.security_protocol == "PLAINTEXT":
            return KafkaSecurity()
        fields: dict[str, Any] = {"protocol": self.security_protocol}
        if self.sasl_users:
            name, pw = self._credentials(user, password)
            fields.update(sasl_mechanism="PLAIN", username=name, password=pw)
        if self.tls:
            fields["ca_file"] = str(self.ca_file)
        return KafkaSecurity(**fields)

    def client_security(self, user: str | None = None, password: str | None = None) -> dict[str, Any]:
        """kafka-python settings to connect as ``user`` (:meth:`security`'s kafka-python form)."""
        return self.security(user, password).kafka_python()

    def spark_kafka_options(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """The same for Spark's Kafka source: ``kafka.*`` options (:meth:`security`'s Spark form)."""
        return self.security(user, password).spark_options()

    @property
    def server_log(self) -> Path:
        """The broker's log4j log file."""
        return self.log_dir / "server.log"

    @property
    def pid(self) -> int | None:
        """Pid of the running broker (ours or one found through the pidfile), else None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_our_broker(pid) else None

    def is_running(self) -> bool:
        """Whether the broker process is alive (not whether it serves requests)."""
        return self.pid is not None

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Write the config, format storage on first use, launch the JVM and wait until it serves."""
        if self.is_running():
            raise KafkaBrokerError(
                f"broker {self.name!r} already runs (pid {self.pid}) at {self.bootstrap_servers}"
            )
        java = java_executable()
        jars = kafka_broker_jars_dir()
        for p in (self.port, self.controller_port):
            if _port_in_use(p):
                raise KafkaBrokerError(
                    f"port {p} on 127.0.0.1 is already in use; pick another port (port=0: a free one)"
                )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self._make_tls_material(java)
        self._write_config()
        classpath = f"{jars}/*"
        if not (self.data_dir / "meta.properties").exists():
            self._format(java, classpath)
        cmd = [java, *self._jvm_opts(), "-cp", classpath, "kafka.Kafka", str(self.properties_path)]
        if self.die_with_parent and shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "TERM", *cmd]  # setpriv execs java: same pid
        with open(self.log_dir / "stdout.log", "ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        self.info_path.write_text(
            json.dumps(
                {
                    "port": self.port,
                    "controller_port": self.controller_port,
                    "security_protocol": self.security_protocol,
                }
            )
            + "\n"
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until a kafka-python admin client can describe the cluster; raise with the log tail."""
        from kafka import KafkaAdminClient  # lazy: the CLI's stop/status need no client

        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            if not self.is_running():
                raise KafkaBrokerError(f"Kafka broker {self.name!r} exited during startup\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers,
                    bootstrap_timeout_ms=3000,
                    request_timeout_ms=5000,
                    **self.client_security(),
                )
                try:
                    cluster = admin.describe_cluster()
                finally:
                    admin.close()
                if cluster.get("brokers"):
                    return
                last_error = KafkaBrokerError(f"no brokers in cluster metadata yet: {cluster}")
            except Exception as e:  # connection refused, bootstrap timeout, broker not ready ...
                last_error = e
            time.sleep(0.2)
        raise KafkaBrokerError(
            f"Kafka broker {self.name!r} at {self.bootstrap_servers} not ready after {timeout:.0f}s "
            f"(last error: {last_error!r})\n{self.log_tail()}"
        )

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None, timeout: float = 30.0
    ) -> str:
        """Make topic ``name`` exist with ``partitions`` partitions (replication factor 1), and wait until
        every partition has a leader.

        Idempotent: a topic that already exists with the same partition count is left as it is (a
        broker's data survives restarts, and so do its topics). One with another count raises
        :class:`TopicMismatch`: partials are placed by ``hash mod partitions``, so silently using a
        topic of another size would split groups over partitions.
        """
        from kafka import KafkaAdminClient
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            request_timeout_ms=int(timeout * 1000),
            **self.client_security(),
        )
        try:
            spec = {"num_partitions": partitions, "replication_factor": 1, "configs": dict(config or {})}
            try:
                admin.create_topics({name: spec}, timeout_ms=int(timeout * 1000))
            except TopicAlreadyExistsError:
                have = self._partitions_of(admin, name)
                if have != partitions:
                    raise TopicMismatch(name, have, partitions, self) from None
            admin.wait_for_topics([name], timeout_ms=int(timeout * 1000))
        finally:
            admin.close()
        return name

    @staticmethod
    def _partitions_of(admin: Any, name: str) -> int | None:
        for d in admin.describe_topics([name]):
            if d.get("name", d.get("topic")) == name and d.get("error_code", 0) == 0:
                return len(d["partitions"])
        return None

    def wipe(self) -> None:
        """Delete the broker's data, logs and recorded ports (a fresh broker on the next start).

        Refused while the broker runs: its files are open and it would recreate them.
        """
        if self.is_running():
            raise KafkaBrokerError(
                f"broker {self.name!r} runs (pid {self.pid}); stop it before wiping its data"
            )
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown: SIGTERM (Kafka flushes and closes its logs), SIGKILL after ``timeout``."""
        pid = self.pid
        if pid is not None:
            self._signal(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout):
                self._signal(pid, signal.SIGKILL)
                self._wait_exit(pid, 10.0)
        self._forget()

    def kill(self) -> None:
        """SIGKILL, as a crash would; data on disk is then recovered by the next start."""
        pid = self.pid
        if pid is not None:
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
        self._forget()

    def restart(self, timeout: float = 90.0) -> KafkaBroker:
        """Stop (if running) and start again with the same data directory and ports."""
        self.stop()
        return self.start(timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's logs, for error messages."""
        parts = []
        for path in (self.server_log, self.log_dir / "stdout.log"):
            text = _tail(path, lines)
            if text:
                parts.append(f"--- last lines of {path} ---\n{text}")
        return "\n".join(parts) or f"(no log output in {self.log_dir})"

    def __enter__(self) -> KafkaBroker:
        return self.start() if not self.is_running() else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KafkaBroker(name={self.name!r}, bootstrap={self.bootstrap_servers}, pid={self.pid})"

    # -- internals --------------------------------------------------------------------------

    def _stored_ports(self) -> tuple[int, int] | None:
        try:
            info = json.loads(self.info_path.read_text())
            return int(info["port"]), int(info["controller_port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _credentials(self, user: str | None, password: str | None) -> tuple[str, str]:
        name = user or self.admin_user or ""
        if password is None:
            if name not in self.sasl_users:
                raise KeyError(
                    f"no SASL user {name!r} on broker {self.name!r} (users: {sorted(self.sasl_users)})"
                )
            password = self.sasl_users[name]
        return name, password

    def _config(self) -> dict[str, str]:
        lst = self.security_protocol  # the client (and inter-broker) listener, named after its protocol
        cfg = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "listeners": f"{lst}://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"{lst}://127.0.0.1:{self.port}",
            "listener.security.protocol.map": f"{lst}:{lst},CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": lst,
            # A dynamic (KIP-853) quorum: what `StorageTool format --standalone` expects.
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            # One node: internal topics cannot have more replicas, and fewer partitions start faster.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # After a SIGKILL the restarted broker is refused (DUPLICATE_BROKER_REGISTRATION) until its
            # old registration's session expires: 9 s by default, made shorter for fault tests.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # 2 cores: fewer threads than the defaults (3 network, 8 io).
            "num.network.threads": "2",
            "num.io.threads": "2",
        }
        cfg.update(self._security_config(lst))
        cfg.update(self.extra_config)
        return cfg

    def _security_config(self, listener: str) -> dict[str, str]:
        cfg: dict[str, str] = {}
        if self.sasl_users:
            admin, password = self._credentials(None, None)
            cfg["sasl.enabled.mechanisms"] = "PLAIN"
            cfg["sasl.mechanism.inter.broker.protocol"] = "PLAIN"
            # username/password: what the broker itself logs in with (inter-broker); user_<name>: who may log in
            cfg[f"listener.name.{listener.lower()}.plain.sasl.jaas.config"] = plain_jaas_config(
                admin, password, **self.sasl_users
            )
        if self.tls:
            password = (self.tls_dir / "store.password").read_text().strip()
            cfg.update(
                {
                    "ssl.keystore.type": "PKCS12",
                    "ssl.keystore.location": str(self.tls_dir / "broker.p12"),
                    "ssl.keystore.password": password,
                    "ssl.key.password": password,
                    # the broker is its own inter-broker client: it trusts the same CA as every client
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(self.ca_file),
                    "ssl.client.auth": "none",
                    "ssl.endpoint.identification.algorithm": "https",
                }
            )
        if self.acls:
            cfg["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            # ANONYMOUS: the PLAINTEXT controller listener's principal (see the class docstring)
            cfg["super.users"] = f"User:{self.admin_user};User:ANONYMOUS"
            cfg["allow.everyone.if.no.acl.found"] = "false"
        return cfg

    def _make_tls_material(self, java: str) -> None:
        """A CA and a broker key pair + certificate (SAN IP:127.0.0.1, DNS:localhost), made by keytool once."""
        tls = self.tls_dir
        done = tls / "store.password"  # written last: its presence means the material is complete
        if done.exists() and (tls / "broker.p12").exists() and self.ca_file.exists():
            return
        keytool = Path(java).resolve().parent / "keytool"
        kt = str(keytool) if keytool.exists() else shutil.which("keytool")
        if kt is None:
            raise KafkaBrokerError(
                "tls=True needs `keytool` (part of the Java runtime) next to java or on PATH"
            )
        if tls.exists():
            shutil.rmtree(tls)
        tls.mkdir(mode=0o700, parents=True)
        pw = secrets.token_hex(16)
        ca, broker = tls / "ca.p12", tls / "broker.p12"
        store = ["-storetype", "PKCS12", "-storepass", pw]
        keypair = ["-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "3650"]

        def run(*args: str, stdin: str | None = None) -> str:
            proc = subprocess.run([kt, *args], input=stdin, capture_output=True, text=True, cwd=tls)
            if proc.returncode != 0:
                raise KafkaBrokerError(
                    f"keytool {args[0]} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
                )
            return proc.stdout

        run(
            *keypair,
            "-alias",
            "ca",
            "-dname",
            "CN=lowwater local test CA",
            "-ext",
            "bc:c",
            "-keystore",
            str(ca),
            *store,
        )
        run("-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), *store, "-file", str(self.ca_file))
        run(*keypair, "-alias", "broker", "-dname", "CN=localhost", "-keystore", str(broker), *store)
        csr = run("-certreq", "-alias", "broker", "-keystore", str(broker), *store)
        signed = run(
            "-gencert",
            "-rfc",
            "-alias",
            "ca",
            "-keystore",
            str(ca),
            *store,
            "-validity",
            "3650",
            "-ext",
            "SAN=IP:127.0.0.1,DNS:localhost",
            "-ext",
            "KU=digitalSignature,keyEncipherment",
            "-ext",
            "EKU=serverAuth,clientAuth",
            stdin=csr,
        )
        (tls / "broker.pem").write_text(signed)
        for alias, pem in (("ca", self.ca_file), ("broker", tls / "broker.pem")):  # CA first, then the reply
            run(
                "-importcert",
                "-noprompt",
                "-alias",
                alias,
                "-file",
                str(pem),
                "-keystore",
                str(broker),
                *store,
            )
        ca.unlink()  # nothing else will be signed: a lying-around CA key that clients trust is a liability
        done.write_text(pw + "\n")
        for f in tls.iterdir():
            f.chmod(0o600)

    def _write_config(self) -> None:
        body = "".join(f"{k}={v}\n" for k, v in self._config().items())
        if self.sasl_users or self.tls:  # JAAS and keystore passwords: owner only, before they are written
            self.properties_path.touch(mode=0o600)
            self.properties_path.chmod(0o600)
        self.properties_path.write_text(
            f"# written by local_stack.kafka_broker; edits are overwritten\n{body}"
        )
        log = self.server_log
        self.log4j_path.write_text(
            f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- written by local_stack.kafka_broker: everything to a file, nothing to the console -->
<Configuration status="WARN">
  <Appenders>
    <RollingFile name="FILE" fileName="{log}" filePattern="{log}.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="20 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.server.authorizer" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="FILE"/></Root>
  </Loggers>
</Configuration>
"""
        )

    def _jvm_opts(self) -> list[str]:
        return [
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_path}",
            f"-Dkafka.logs.dir={self.log_dir}",
        ]

    def _quorum(self) -> tuple[str, list[str]]:
        """The cluster id and quorum flags :meth:`_format` gives: a new id and a one-voter dynamic quorum."""
        return _kafka_uuid(), ["--standalone"]

    def _format(self, java: str, classpath: str) -> None:
        """`kafka-storage.sh format` of the data directory, with the id and flags of :meth:`_quorum`."""
        cluster_id, flags = self._quorum()
        cmd = [
            java,
            *self._jvm_opts(),
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.properties_path),
            *flags,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.base_dir)
        if proc.returncode != 0:
            raise KafkaBrokerError(
                f"formatting {self.data_dir} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )

    def _is_our_broker(self, pid: int) -> bool:
        """Guards against a stale pidfile whose pid now belongs to another process."""
        if not _pid_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"kafka.Kafka" in cmdline and str(self.properties_path).encode() in cmdline

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # the broker leads its own process group (start_new_session)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            try:
                self._proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                return True
            time.sleep(0.1)
        return False

    def _forget(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return  # still alive: keep the handle and the pidfile
        self._proc = None
        self.pid_path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: start (detached), stop or report a broker under the repo's state dir."""
    parser = argparse.ArgumentParser(
        prog="python -m local_stack.kafka_broker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--name", default="default", help="broker name: data in <state>/kafka/<name>")
    parser.add_argument(
        "--port", type=int, default=None, help="client port (default: last used, else 9092; 0: free)"
    )
    parser.add_argument(
        "--state-dir", default=None, help="state dir (default: $LOWWATER_STATE_DIR or <repo>/.state)"
    )
    parser.add_argument(
        "--sasl-user",
        action="append",
        default=None,
        metavar="NAME=PASSWORD",
        help="SASL/PLAIN on the client listener; repeatable; the first is the broker's own user",
    )
    parser.add_argument(
        "--tls", action="store_true", help="TLS on the client listener (CA: <data>/tls/ca.pem)"
    )
    parser.add_argument(
        "--acls", action="store_true", help="enforce ACLs (needs --sasl-user; the first is a super user)"
    )
    args = parser.parse_args(argv)
    users = None
    if args.sasl_user:
        users = dict(u.partition("=")[::2] for u in args.sasl_user)
    try:
        broker = KafkaBroker(
            args.name,
            args.port,
            state=args.state_dir,
            die_with_parent=False,
            sasl_users=users,
            tls=args.tls,
            acls=args.acls,
        )
    except ValueError as e:
        parser.error(str(e))
    if args.command == "start":
        if broker.is_running():
            print(f"already running: pid {broker.pid}, bootstrap {broker.bootstrap_servers}")
            return 0
        t0 = time.monotonic()
        try:
            broker.start()
        except KafkaBrokerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(
            f"started in {time.monotonic() - t0:.1f}s: pid {broker.pid}, bootstrap {broker.bootstrap_servers}, "
            f"log {broker.server_log}"
        )
        if broker.security_protocol != "PLAINTEXT":
            print(f"security {broker.security_protocol}" + (f", CA {broker.ca_file}" if broker.tls else ""))
        return 0
    if args.command == "stop":
        if not broker.is_running():
            print("not running")
            return 0
        pid = broker.pid
        broker.stop()
        print(f"stopped pid {pid}")
        return 0
    if not broker.is_running():
        print(f"not running (name {args.name!r}, data {broker.data_dir})")
        return 3  # LSB: program is not running
    try:
        broker.wait_ready(timeout=10)
    except KafkaBrokerError as e:
        print(
            f"pid {broker.pid} runs but does not answer at {broker.bootstrap_servers}: {e}", file=sys.stderr
        )
        return 1
    print(f"running: pid {broker.pid}, bootstrap {broker.bootstrap_servers}, log {broker.server_log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
