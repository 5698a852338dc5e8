"""One Kafka security block for every lowwater role, spelled for each Kafka client it uses.

The agent, the topic provisioning and the job's admin client use kafka-python (``security_protocol``,
``sasl_plain_username``, ``ssl_cafile`` ...); the job's Spark Kafka source uses the Java client's
``kafka.*`` options (``kafka.security.protocol``, ``kafka.sasl.jaas.config`` ...); the API's reader of
the live topics uses librdkafka (``security.protocol``, ``sasl.username`` ...). An operator writes
the block once (flag ``--kafka-security '<JSON>'``, environment ``LOWWATER_<ROLE>_KAFKA_SECURITY__*``
or the role's settings file) and :meth:`KafkaSecurity.kafka_python` / :meth:`KafkaSecurity.spark_options`
/ :meth:`KafkaSecurity.librdkafka` derive each, so every client of a role authenticates the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

SASL_USER = re.compile(r"[A-Za-z0-9._-]+")  # a JAAS option key (user_<name>) must be one plain word
_LOGIN = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def check_sasl_credentials(users: Mapping[str, str]) -> None:
    """Raise ValueError for a user name or password that cannot go verbatim into a JAAS config."""
    for name, password in users.items():
        if not SASL_USER.fullmatch(name):
            raise ValueError(f"SASL user name {name!r}: use letters, digits, '.', '_' and '-' only")
        if not password or any(c in '"\\' or not c.isprintable() for c in password):
            raise ValueError(f"password of SASL user {name!r}: non-empty, printable, no quote or backslash")


def jaas_config(mechanism: str, username: str, password: str) -> str:
    """A client ``sasl.jaas.config`` value for ``mechanism``."""
    check_sasl_credentials({username: password})
    return f'{_LOGIN[mechanism]} required username="{username}" password="{password}";'


# kafka-python keyword -> librdkafka property (KafkaSecurity.librdkafka)
_LIBRDKAFKA = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
}


class KafkaSecurity(BaseModel):
    """How a lowwater role authenticates to Kafka and checks the broker (PLAINTEXT when empty)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = None
    password: SecretStr | None = None
    ca_file: str | None = None  # PEM: the CA that signed the brokers' certificates
    cert_file: str | None = None  # PEM client certificate (mutual TLS)
    key_file: str | None = None  # PEM private key of cert_file (PKCS#8, unencrypted)
    check_hostname: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol.endswith("SSL")
        if sasl:
            if not (self.sasl_mechanism and self.username and self.password):
                raise ValueError(f"protocol {self.protocol} needs sasl_mechanism, username and password")
            check_sasl_credentials({self.username: self.password.get_secret_value()})
        elif self.sasl_mechanism or self.username or self.password:
            raise ValueError(f"sasl_mechanism/username/password need a SASL_* protocol, not {self.protocol}")
        if not tls and (self.ca_file or self.cert_file or self.key_file or not self.check_hostname):
            raise ValueError(
                f"ca_file/cert_file/key_file/check_hostname need an SSL protocol, not {self.protocol}"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together (mutual TLS)")
        return self

    @property
    def is_plaintext(self) -> bool:
        return self.protocol == "PLAINTEXT"

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python client settings (producer, admin)."""
        out: dict[str, Any] = {}
        if self.is_plaintext:
            return out
        out["security_protocol"] = self.protocol
        if self.protocol.startswith("SASL_"):
            assert self.password is not None
            out.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.username,
                sasl_plain_password=self.password.get_secret_value(),
            )
        if self.ca_file:
            out["ssl_cafile"] = self.ca_file
        if self.cert_file:
            out.update(ssl_certfile=self.cert_file, ssl_keyfile=self.key_file)
        if self.protocol.endswith("SSL") and not self.check_hostname:
            out["ssl_check_hostname"] = False
        return out

    def librdkafka(self) -> dict[str, str]:
        """librdkafka settings (``confluent-kafka``: the API's reader of the live topics): the
        kafka-python settings under librdkafka's names, so which fields apply is decided once."""
        kp = self.kafka_python()
        out = {_LIBRDKAFKA[k]: v for k, v in kp.items() if k in _LIBRDKAFKA}
        if kp.get("ssl_check_hostname") is False:
            out["ssl.endpoint.identification.algorithm"] = "none"
        return out

    def spark_options(self) -> dict[str, str]:
        """``kafka.*`` options of Spark's Kafka source (its consumers and admin client)."""
        out: dict[str, str] = {}
        if self.is_plaintext:
            return out
        out["kafka.security.protocol"] = self.protocol
        if self.protocol.startswith("SASL_"):
            assert self.sasl_mechanism and self.username and self.password is not None
            out["kafka.sasl.mechanism"] = self.sasl_mechanism
            out["kafka.sasl.jaas.config"] = jaas_config(
                self.sasl_mechanism, self.username, self.password.get_secret_value()
            )
        if self.ca_file:
            out["kafka.ssl.truststore.type"] = "PEM"
            out["kafka.ssl.truststore.location"] = self.ca_file
        if self.cert_file and self.key_file:  # the Java client takes PEM material inline, not as paths
            out["kafka.ssl.keystore.type"] = "PEM"
            out["kafka.ssl.keystore.certificate.chain"] = Path(self.cert_file).read_text()
            out["kafka.ssl.keystore.key"] = Path(self.key_file).read_text()
        if self.protocol.endswith("SSL") and not self.check_hostname:
            out["kafka.ssl.endpoint.identification.algorithm"] = ""
        return out

    def revealed(self) -> dict[str, Any]:
        """The block as plain JSON-able values, password included: for handing it to a child process."""
        out = self.model_dump(exclude_none=True, exclude={"password"})
        if self.password is not None:
            out["password"] = self.password.get_secret_value()
        return out
