"""The query model and everything derived from it, one module per concept.

* :mod:`~contract.query.model`: aggregate queries (windows, group-by, aggregates, HAVING, alerts);
* :mod:`~contract.query.layout`: the runtime layout both levels derive from a query (key and state words);
* :mod:`~contract.query.selects` and :mod:`~contract.query.joins`: ``kind: select`` and ``kind: join``;
* :mod:`~contract.query.configfile`: loading a YAML config with file, line and reason on every error.

The public names are re-exported here, so ``from contract import query as Q; Q.QuerySpec`` reads the same
whichever module defines them.
"""

from contract.aggregates import (
    DEFAULT_ACCURACY,
    MAX_TOP_CAPACITY,
    MERGE_MAX,
    MERGE_MIN,
    MERGE_SUM,
    quantile_suffix,
)
from contract.query.configfile import Config, load, load_selects_joins, load_text, uses_enrichment
from contract.query.joins import (
    ClosedInput,
    JoinAggregate,
    JoinOn,
    JoinSpec,
    check_join,
    closed_topic,
    join_result_query,
    parse_join_expr,
    rows_query,
)
from contract.query.layout import (
    KEY_BUCKET,
    KEY_HLL,
    KEY_INT,
    KEY_IP,
    SRC_COMPUTED,
    SRC_DSCP,
    SRC_ONE,
    StateColumn,
    decode_computed,
    decode_key,
    finalize,
    group_width,
    hll_rank_source,
    key_program,
    key_width,
    merge_ops,
    partition_width,
    state_columns,
    subkey_width,
)
from contract.query.model import (
    ALERT_LABELS,
    HOLISTIC,
    NS,
    SEVERITIES,
    AggregateSpec,
    AlertSpec,
    ConfigError,
    Duration,
    ExportSpec,
    FlushSpec,
    HeartbeatSpec,
    KafkaSpec,
    KeyPart,
    QuerySpec,
    TableSpec,
    WindowSpec,
    accuracy_ppb,
    condition,
    holistic,
    parse_duration_ns,
    result_names,
)
from contract.query.selects import SelectSpec

__all__ = [
    "ALERT_LABELS", "DEFAULT_ACCURACY", "HOLISTIC", "KEY_BUCKET", "KEY_HLL", "KEY_INT", "KEY_IP", "MAX_TOP_CAPACITY",
    "MERGE_MAX", "MERGE_MIN", "MERGE_SUM", "NS", "SEVERITIES", "SRC_COMPUTED", "SRC_DSCP", "SRC_ONE",
    "AggregateSpec", "AlertSpec", "ClosedInput", "Config", "ConfigError", "Duration", "ExportSpec", "FlushSpec",
    "HeartbeatSpec", "JoinAggregate", "JoinOn", "JoinSpec", "KafkaSpec", "KeyPart", "QuerySpec", "SelectSpec",
    "StateColumn", "TableSpec", "WindowSpec", "accuracy_ppb", "check_join", "closed_topic", "condition",
    "decode_computed", "decode_key", "finalize", "group_width", "hll_rank_source", "holistic", "join_result_query",
    "key_program", "key_width", "load", "load_selects_joins", "load_text", "merge_ops", "parse_duration_ns",
    "parse_join_expr", "partition_width", "quantile_suffix", "result_names", "rows_query", "state_columns",
    "subkey_width", "uses_enrichment",
]  # fmt: skip
