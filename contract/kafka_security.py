"""One Kafka security block, spelled for both clients lowwater uses.

Spark's Kafka source takes ``kafka.*`` options (Java client names: ``kafka.security.protocol``,
``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location`` ...); kafka-python, which the agent and
the job's topic provisioning use, takes ``security_protocol``, ``sasl_plain_username``,
``ssl_cafile`` .... An operator writes the settings once (the Spark form, as in
``deploy/SECURITY.md``) and :func:`kafka_python_settings` derives the other, so the job's admin
client authenticates exactly as its Kafka source does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_JAAS = re.compile(r'username="(?P<user>[^"]*)"\s+password="(?P<password>[^"]*)"')
_MECHANISMS = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
_PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}


class KafkaSecurityError(ValueError):
    """Security options that cannot be carried over to the other client."""


def kafka_python_settings(spark_options: Mapping[str, str]) -> dict[str, Any]:
    """kafka-python client settings equivalent to Spark Kafka-source ``kafka.*`` security options.

    Understood: ``kafka.security.protocol``, ``kafka.sasl.mechanism`` (PLAIN, SCRAM-SHA-256/512),
    ``kafka.sasl.jaas.config`` (username/password), ``kafka.ssl.truststore.location`` of type PEM,
    ``kafka.ssl.endpoint.identification.algorithm`` (empty: no host name check). Any other
    ``kafka.ssl.*``/``kafka.sasl.*`` option is refused rather than silently dropped: an admin client
    that connected without it would fail later, or connect less securely.
    """
    o = dict(spark_options)
    out: dict[str, Any] = {}
    protocol = o.pop("kafka.security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise KafkaSecurityError(f"kafka.security.protocol {protocol!r}: expected one of {sorted(_PROTOCOLS)}")
    if protocol != "PLAINTEXT":
        out["security_protocol"] = protocol
    mech = o.pop("kafka.sasl.mechanism", None)
    jaas = o.pop("kafka.sasl.jaas.config", None)
    if protocol.startswith("SASL_"):
        mech = (mech or "GSSAPI").upper()
        if mech not in _MECHANISMS:
            raise KafkaSecurityError(f"kafka.sasl.mechanism {mech!r}: lowwater supports {sorted(_MECHANISMS)}")
        m = _JAAS.search(jaas or "")
        if not m:
            raise KafkaSecurityError("kafka.sasl.jaas.config must give username=\"...\" password=\"...\"")
        out.update(sasl_mechanism=mech, sasl_plain_username=m["user"], sasl_plain_password=m["password"])
    if protocol.endswith("SSL"):
        location = o.pop("kafka.ssl.truststore.location", None)
        kind = o.pop("kafka.ssl.truststore.type", "PEM" if location else None)
        if location and str(kind).upper() != "PEM":
            raise KafkaSecurityError("kafka.ssl.truststore.type must be PEM (kafka-python reads PEM CA files)")
        if location:
            out["ssl_cafile"] = location
        if o.pop("kafka.ssl.endpoint.identification.algorithm", None) == "":
            out["ssl_check_hostname"] = False
    left = sorted(k for k in o if k.startswith(("kafka.ssl.", "kafka.sasl.")))
    if left:
        raise KafkaSecurityError(f"security options the job's admin client cannot apply: {left}")
    return out
