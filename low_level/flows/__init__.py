"""Flow collection: NetFlow v5/v9 and IPFIX datagrams decoded and sub-aggregated like packets."""
