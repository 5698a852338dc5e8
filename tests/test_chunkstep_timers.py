"""The chunked step's time mode per checkpoint: new checkpoints run without timers (the driver's cost per
batch), one written with processing-time timers keeps them (Spark refuses a changed time mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from high_level.aggregate.chunkstep import processing_timers


def _metadata(ckpt: Path, mode: str, op: int = 0) -> None:
    """Operator metadata as Spark 4 writes it for transformWithStateInPandas (state/<op>/_metadata/v2/<batch>)."""
    d = ckpt / "state" / str(op) / "_metadata" / "v2"
    d.mkdir(parents=True)
    props = {"timeMode": mode, "outputMode": "Append", "stateVariables": []}
    doc = {
        "operatorInfo": {"operatorId": op, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [],
        "operatorPropertiesJson": json.dumps(props),
    }
    (d / "0").write_text("v2\n" + json.dumps(doc))
    (d / ".0.crc").write_bytes(b"\x00crc")


def test_a_fresh_or_timerless_checkpoint_runs_without_timers(tmp_path: Path) -> None:
    assert not processing_timers(tmp_path / "none-yet")
    _metadata(tmp_path / "c", "None")
    assert not processing_timers(tmp_path / "c")
    assert not processing_timers(f"file://{tmp_path / 'c'}")


def test_a_checkpoint_written_with_timers_keeps_them(tmp_path: Path) -> None:
    _metadata(tmp_path / "c", "ProcessingTime")
    assert processing_timers(tmp_path / "c")
    assert processing_timers("hdfs://nn/ckpt")  # unreadable here: keep what the old job did


def test_unreadable_metadata_is_a_clear_error(tmp_path: Path) -> None:
    d = tmp_path / "c" / "state" / "0" / "_metadata" / "v2"
    d.mkdir(parents=True)
    (d / "0").write_text("v2\n{not json")
    with pytest.raises(ValueError, match="operator metadata"):
        processing_timers(tmp_path / "c")
