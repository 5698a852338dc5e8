"""Join queries: the band join, its per-partition step, its inputs and its streaming pipeline."""
