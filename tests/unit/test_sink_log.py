"""A file sink's directory holding another query's micro-batch log is refused (or cleared) before a query starts."""

from __future__ import annotations

import pytest

from flowspark.errors import RecoveryError
from flowspark.spark.streaming.checkpoint import check_meta, check_sink_log


def _log(path, names):
    path.mkdir(parents=True, exist_ok=True)
    for name in names:
        (path / name).write_text("v1\n")


def test_a_new_checkpoint_on_an_output_written_by_another_query_is_refused_with_both_ways_on(tmp_path):
    out = tmp_path / "out"
    _log(out / "_spark_metadata", ["0", "1", ".1.crc", "2"])
    (out / "part-0.parquet").write_bytes(b"x")
    with pytest.raises(RecoveryError) as ei:
        check_sink_log(str(tmp_path / "chk"), "out", str(out))
    msg = str(ei.value)
    assert "\n" not in msg
    assert "output step 'out'" in msg
    assert repr(str(out)) in msg
    assert "micro-batches up to 2" in msg
    assert "planned none" in msg
    assert "new output path" in msg
    assert "clear_outputs=True" in msg
    assert "--clear-outputs" in msg
    assert (out / "part-0.parquet").exists()  # refused: nothing deleted


def test_an_output_log_past_what_the_checkpoint_planned_is_refused(tmp_path):
    out, chk = tmp_path / "out", tmp_path / "chk"
    _log(out / "_spark_metadata", ["9.compact", "10"])
    _log(chk / "query" / "offsets", ["0", "1", "2"])
    with pytest.raises(RecoveryError, match="micro-batches up to 10; checkpoint .* planned micro-batches up to 2"):
        check_sink_log(str(chk), "out", str(out))


@pytest.mark.parametrize(
    ("written", "planned"),
    [
        (["0", "1"], ["0", "1"]),  # the same query, restarted
        (["0", "1", "2"], ["0", "1", "2"]),  # batch 2 written, not committed: its replay is skipped, rightly
        (["0"], ["0", "1"]),  # batch 1 planned, not yet written
        ([], []),  # a new output
    ],
)
def test_the_querys_own_output_passes(tmp_path, written, planned):
    out, chk = tmp_path / "out", tmp_path / "chk"
    _log(out / "_spark_metadata", written)
    _log(chk / "query" / "offsets", planned)
    assert check_sink_log(str(chk), "out", str(out)) is False
    assert out.exists()


def test_a_missing_output_directory_passes(tmp_path):
    assert check_sink_log(str(tmp_path / "chk"), "out", str(tmp_path / "nothing")) is False


def test_clear_deletes_the_other_querys_output(tmp_path):
    out = tmp_path / "out"
    _log(out / "_spark_metadata", ["0"])
    (out / "part-0.parquet").write_bytes(b"x")
    assert check_sink_log(str(tmp_path / "chk"), "out", str(out), clear=True) is True
    assert not out.exists()


def test_the_error_for_another_flows_checkpoint_mentions_the_output(tmp_path):
    chk = str(tmp_path / "chk")
    check_meta(chk, "first", 8, ["first.count"])
    with pytest.raises(RecoveryError, match="delete this one to start over .*output directory.*clear_outputs=True"):
        check_meta(chk, "second", 8, ["second.count"])
