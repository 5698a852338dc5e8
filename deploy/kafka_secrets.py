#!/usr/bin/env python3
"""Kafka's external listener, secure by default: a CA, the broker's certificate, one credential per capture host.

Run on the central host before the first ``up`` and again whenever a capture host is added (existing
material is kept; only what is missing is made):

    python3 deploy/kafka_secrets.py --external-host central.example.net capture-01 capture-02

Writes under ``deploy/secrets/kafka/`` (``--dir``; compose: ``KAFKA_SECRETS_DIR``):

* ``ca.key`` (owner only) and ``ca.pem``: the CA that signs the broker's certificate (10 years);
* ``broker.pem``: the broker's key and certificate (PEM keystore), for ``--external-host`` and any
  ``--san``; made again when the names change;
* ``kafka_server_jaas.conf``: the SASL/PLAIN users of the EXTERNAL listener, one per capture host;
* ``capture-hosts.txt``: the capture host ids, from which kafka-init grants each one WRITE on its
  queries' topics and READ on the control topic, and nothing else (Kafka ACLs);
* ``capture-hosts/<host>/``: what to copy to that capture host: ``ca.pem`` (its ``KAFKA_CERTS_DIR``)
  and ``agent.env``, the lines to add to its ``.env`` (host id and the Kafka security block).

Only the standard library and the ``openssl`` command are needed. The broker must be restarted to
learn a new user (``docker-compose up -d kafka`` after this script, then kafka-init for the ACLs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

HOST_ID = re.compile(r"[A-Za-z0-9._-]+")  # a SASL user name and a JAAS option key: one plain word
DEFAULT_DIR = Path(__file__).resolve().parent / "secrets" / "kafka"


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kafka_secrets: openssl {args[0]} failed: {proc.stderr.strip()}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def make_ca(d: Path) -> bool:
    if (d / "ca.key").exists() and (d / "ca.pem").exists():
        return False
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:3072",
        "-nodes",
        "-days",
        "3650",
        "-subj",
        "/CN=lowwater Kafka CA",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    (d / "ca.key").chmod(0o600)
    (d / "ca.pem").chmod(0o644)
    return True


def make_broker(d: Path, names: list[str], force: bool) -> bool:
    """broker.pem (key + certificate); made again when the subject names differ from the last run."""
    sans = ",".join(
        f"IP:{n}" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]+:[0-9a-fA-F:]*", n) else f"DNS:{n}" for n in names
    )
    stamp = d / ".broker-names"
    if not force and (d / "broker.pem").exists() and stamp.exists() and stamp.read_text() == sans:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _openssl(
            "req",
            "-newkey",
            "rsa:3072",
            "-nodes",
            "-subj",
            f"/CN={names[0]}",
            "-keyout",
            str(t / "key.pem"),
            "-out",
            str(t / "req.csr"),
        )
        (t / "ext.cnf").write_text(
            f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(t / "req.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "825",
            "-extfile",
            str(t / "ext.cnf"),
            "-out",
            str(t / "cert.pem"),
        )
        _openssl("pkcs8", "-topk8", "-nocrypt", "-in", str(t / "key.pem"), "-out", str(t / "key8.pem"))
        # read by the broker's user (uid 1000 in the Kafka image): like deploy/secrets/*, world-readable
        _write(
            d / "broker.pem",
            (t / "key8.pem").read_text() + (t / "cert.pem").read_text() + (d / "ca.pem").read_text(),
        )
    stamp.write_text(sans)
    return True


def read_users(d: Path) -> dict[str, str]:
    jaas = d / "kafka_server_jaas.conf"
    return dict(re.findall(r'user_([A-Za-z0-9._-]+)="([^"]*)"', jaas.read_text())) if jaas.exists() else {}


def write_users(d: Path, users: dict[str, str], external_host: str, port: int) -> None:
    body = "".join(f'\n  user_{u}="{p}"' for u, p in sorted(users.items()))
    # a section per SASL listener name: only EXTERNAL authenticates (INTERNAL is PLAINTEXT, inside)
    _write(
        d / "kafka_server_jaas.conf",
        "// written by deploy/kafka_secrets.py: capture hosts of the EXTERNAL listener\n"
        f"external.KafkaServer {{\n  org.apache.kafka.common.security.plain.PlainLoginModule required{body};\n}};\n",
    )
    _write(d / "capture-hosts.txt", "".join(f"{u}\n" for u in sorted(users)))
    for u, p in users.items():
        host_dir = d / "capture-hosts" / u
        _write(host_dir / "ca.pem", (d / "ca.pem").read_text())
        block = {
            "protocol": "SASL_SSL",
            "sasl_mechanism": "PLAIN",
            "username": u,
            "password": p,
            "ca_file": "/etc/lowwater/kafka/ca.pem",
        }
        _write(
            host_dir / "agent.env",
            f"# capture host {u}: add to deploy/capture-host/.env there; ca.pem goes to its "
            f"KAFKA_CERTS_DIR\nLOWWATER_AGENT_HOST_ID={u}\nLOWWATER_AGENT_BOOTSTRAP={external_host}:{port}\n"
            f"LOWWATER_AGENT_KAFKA_SECURITY={json.dumps(block, separators=(',', ':'))}\n",
            mode=0o600,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "hosts", nargs="*", help="capture host ids (their LOWWATER_AGENT_HOST_ID) to give a credential"
    )
    ap.add_argument(
        "--external-host",
        default=os.environ.get("KAFKA_EXTERNAL_HOST", "localhost"),
        help="the name capture hosts reach Kafka by (KAFKA_EXTERNAL_HOST); in the broker's certificate",
    )
    ap.add_argument("--external-port", type=int, default=int(os.environ.get("KAFKA_EXTERNAL_PORT", "9094")))
    ap.add_argument(
        "--san", action="append", default=[], help="another name or IP address for the certificate"
    )
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("KAFKA_SECRETS_DIR", DEFAULT_DIR)))
    ap.add_argument("--new-broker-cert", action="store_true", help="make the broker's certificate again")
    args = ap.parse_args(argv)
    for h in args.hosts:
        if not HOST_ID.fullmatch(h):
            ap.error(f"capture host id {h!r}: letters, digits, '.', '_' and '-' only")
    d = args.dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)
    made = []
    if make_ca(d):
        made.append("CA")
    names = list(dict.fromkeys([args.external_host, *args.san]))
    if make_broker(d, names, args.new_broker_cert):
        made.append(f"broker certificate for {', '.join(names)}")
    users = read_users(d)
    new = [h for h in args.hosts if h not in users]
    users.update({h: secrets.token_urlsafe(24) for h in new})
    write_users(d, users, args.external_host, args.external_port)
    if new:
        made.append(f"credentials for {', '.join(new)}")
    print(f"kafka_secrets: {d}: " + ("made " + "; ".join(made) if made else "nothing new"))
    if new:
        print(
            "kafka_secrets: restart the broker and re-run kafka-init (ACLs): "
            "docker-compose --env-file deploy/.env up -d --force-recreate kafka kafka-init"
        )
        for h in new:
            print(f"kafka_secrets: copy {d / 'capture-hosts' / h}/ to capture host {h} (agent.env, ca.pem)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
