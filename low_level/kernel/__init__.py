"""The compiled per-packet pass: parse, filter, key, sub-aggregate into fixed-size tables, flush."""
