"""Streaming: Spark keys a SparkSource's rows itself (no Python pass before the keyed stage), same results."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest
from streaming_helpers import T0, FileClock

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import SparkSink
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

pytestmark = [pytest.mark.spark]

ROWS = [{"user": f"u{(i * 7) % 5}", "n": i % 4, "pos": i} for i in range(60)]


def _write(spark, path: str, rows: list, files: int) -> None:
    os.makedirs(path, exist_ok=True)
    step = len(rows) // files
    for f in range(files):
        part = rows[f * step : (f + 1) * step]
        spark.createDataFrame(part, "user STRING, n LONG, pos LONG").toPandas().to_parquet(f"{path}/f{f:03d}.parquet")


def _sum_flow(src, out: list) -> Dataflow:
    flow = Dataflow("ck_stream")
    s = op.filter("no_zero", op.input("inp", flow, src), lambda r: r["n"] != 0)
    keyed = op.key_on("key", s, lambda r: r["user"])
    pos = op.map_value("pos", keyed, lambda r: (r["pos"], r["n"]))
    sums = op.stateful_map("sum", pos, lambda st, v: ((st or 0) + v[1], (v[0], (st or 0) + v[1])))
    op.output("out", sums, TestingSink(out))
    return flow


@pytest.mark.parametrize("layout", ["bucket", "key", "chunk"])
def test_spark_keys_a_file_stream_and_results_equal_in_memory(spark, tmp_path, layout):
    from flowspark.spark import run

    src_dir = str(tmp_path / "in")
    _write(spark, src_dir, ROWS, 3)
    streamed: list = []
    src = SparkSource(
        "parquet", src_dir, schema="user STRING, n LONG, pos LONG", options={"maxFilesPerTrigger": "1"}, streaming=True
    )
    opts = {"spark": spark, "checkpoint": str(tmp_path / "chk"), "trigger": "available_now", "progress": False}
    sr = run(_sum_flow(src, streamed), state_layout=layout, **opts)
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    local: list = []
    run_main(_sum_flow(TestingSource(ROWS), local))
    assert per_key(streamed) == per_key(local)
    assert len(streamed) == sum(1 for r in ROWS if r["n"] != 0)
    keyed = sr.plan.stages[1]
    # a new checkpoint's buckets: 64 in the bucket layout, 8 per shuffle partition (2 here), at least 16, otherwise
    b = 64 if layout == "bucket" else 16
    assert f"(stage0's rows, numbered by an Arrow pass) -> groupBy(pmod(hash(user), {b}))" in sr.lowering.stage(keyed)


def test_spark_keyed_stream_with_timers_and_a_restart(spark, tmp_path):
    """Tick rows (timers) join the Spark-keyed rows; a restart keeps the lowering the checkpoint started with."""
    from flowspark.spark import run

    src_dir, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    _write(spark, src_dir, ROWS[:30], 1)
    src = SparkSource("parquet", src_dir, schema="user STRING, n LONG, pos LONG", streaming=True)
    out: list = []

    def flow() -> Dataflow:
        f = Dataflow("ck_timers")
        keyed = op.key_on("key", op.input("inp", f, src), lambda r: r["user"])
        op.output(
            "out",
            op.collect("coll", op.map_value("n", keyed, lambda r: r["n"]), timedelta(hours=1), 3),
            TestingSink(out),
        )
        return f

    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    sr = run(flow(), **opts)
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    _write(spark, src_dir + "_2", ROWS[30:], 1)
    os.rename(f"{src_dir}_2/f000.parquet", f"{src_dir}/f001.parquet")
    run(flow(), **opts)
    got = per_key(out)
    want: dict = {}
    for r in ROWS:
        want.setdefault(r["user"], []).append(r["n"])
    # collect emits full lists of 3; every user has 12 rows: 4 lists each, in input order.
    assert {k: [x for lst in v for x in lst] for k, v in got.items()} == want


def test_a_null_key_in_a_spark_keyed_stream_names_the_step(spark, tmp_path):
    from flowspark.spark import run

    src_dir = str(tmp_path / "in")
    _write(spark, src_dir, [{"user": None, "n": 1, "pos": 0}, {"user": "a", "n": 1, "pos": 1}], 1)
    src = SparkSource("parquet", src_dir, schema="user STRING, n LONG, pos LONG", streaming=True)
    with pytest.raises(FlowsparkRuntimeError, match=r"step .ck_stream\.key.: key function must return a str"):
        run(_sum_flow(src, []), spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)


def _seen_flow(src, out_dir: str) -> Dataflow:
    """One `stateful_map` (the positions seen, in the order it got them) into a `SparkSink`: a `flat` stage."""
    flow = Dataflow("seen")
    keyed = op.key_on("key", op.input("inp", flow, src), lambda r: r["user"])
    seen = op.stateful_map("seen", keyed, lambda st, r: (f"{st} {r['pos']}" if st else str(r["pos"]),) * 2)
    rows = op.map("row", seen, lambda kv: {"user": kv[0], "seen": kv[1]})
    op.output("out", rows, SparkSink("parquet", out_dir, schema="user STRING, seen STRING"))
    return flow


@pytest.mark.parametrize(("per_trigger", "layout"), [(1, "bucket"), (None, "bucket"), (None, "key")])
def test_a_parquet_stream_into_a_one_step_sink_is_ordered_by_file_and_row(spark, tmp_path, per_trigger, layout):
    """Spark's file and row index order each key's rows (no numbering pass); each file's rows keep their order."""
    from flowspark.spark import run

    src_dir, out_dir = str(tmp_path / "in"), str(tmp_path / "out")
    _write(spark, src_dir, ROWS, 3)
    options = {"maxFilesPerTrigger": str(per_trigger)} if per_trigger else {}
    src = SparkSource("parquet", src_dir, schema="user STRING, n LONG, pos LONG", options=options, streaming=True)
    opts = {"spark": spark, "checkpoint": str(tmp_path / "chk"), "trigger": "available_now", "progress": False}
    sr = run(_seen_flow(src, out_dir), state_layout=layout, **opts)
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    assert sr.plan.decision("file_order", "stage 1").applied
    final = {}
    for r in spark.read.parquet(out_dir).collect():
        seen = [int(p) for p in r.seen.split()]
        if len(seen) > len(final.get(r.user, [])):
            final[r.user] = seen
    files = [ROWS[i * 20 : (i + 1) * 20] for i in range(3)]
    for user, seen in final.items():
        blocks = [[r["pos"] for r in f if r["user"] == user] for f in files]
        if per_trigger:  # a file per micro-batch: the source's order
            assert seen == [p for b in blocks for p in b]
        else:  # one micro-batch: each file's rows in order, the files in some order
            assert sorted(seen) == sorted(p for b in blocks for p in b)
            runs = [seen[i : i + len(b)] for i in range(len(seen)) for b in blocks if b and seen[i] == b[0]]
            assert sorted(map(tuple, runs)) == sorted(tuple(b) for b in blocks if b)
    assert set(final) == {r["user"] for r in ROWS}


# Two instants one hour apart that New York's clocks both show as 01:30 (2026-11-01, clocks go back).
_NY_AMBIGUOUS = [datetime(2026, 11, 1, 5, 30, tzinfo=timezone.utc), datetime(2026, 11, 1, 6, 30, tzinfo=timezone.utc)]
_TIMED = [
    {"user": f"u{i % 3}", "ts": t, "ntz": datetime(2026, 1, 1, 12, i)}
    for i, t in enumerate(
        [*_NY_AMBIGUOUS, *(datetime(2026, 1, 1, 0, i, 20 * i % 60, tzinfo=timezone.utc) for i in range(7))]
    )
]


def _write_timed(path: str, rows: list, files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    step = -(-len(rows) // files)
    for f in range(files):
        part = rows[f * step : (f + 1) * step]
        table = pa.table(
            {
                "user": pa.array([r["user"] for r in part], pa.string()),
                "ts": pa.array([r["ts"] for r in part], pa.timestamp("us", tz="UTC")),
                "ntz": pa.array([r["ntz"] for r in part], pa.timestamp("us")),
            }
        )
        pq.write_table(table, f"{path}/f{f:03d}.parquet")
        # A file stream takes files in modification-time order (milliseconds); files written in
        # the same millisecond came in either order, and a later file first made the earlier
        # one's events late (CI, stop 35). One second apart, they come in the order written.
        os.utime(f"{path}/f{f:03d}.parquet", (1_700_000_000 + f, 1_700_000_000 + f))


def _times_flow(src) -> tuple[Dataflow, list]:
    out: list = []
    flow = Dataflow("ck_times")
    keyed = op.key_on("key", op.input("inp", flow, src), lambda r: r["user"])
    seen = op.stateful_map("seen", keyed, lambda st, r: (None, (r["ts"], r["ntz"])))
    op.output("out", seen, TestingSink(out))
    return flow, out


def test_a_spark_keyed_stream_gives_timestamps_as_aware_datetimes_in_the_session_zone(spark, tmp_path):
    """TIMESTAMP: aware `datetime` in the session zone, exact where its clock repeats an hour; NTZ: naive."""
    from flowspark.spark import run

    src_dir = str(tmp_path / "in")
    _write_timed(src_dir, _TIMED, 2)
    src = SparkSource("parquet", src_dir, schema="user STRING, ts TIMESTAMP, ntz TIMESTAMP_NTZ", streaming=True)
    flow, out = _times_flow(src)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        sr = run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    # Instants compared as timestamps: Python never finds an instant of a repeated hour equal across zones.
    got = sorted((k, ts.timestamp(), ntz) for k, (ts, ntz) in out)
    assert got == sorted((r["user"], r["ts"].timestamp(), r["ntz"]) for r in _TIMED)
    for _k, (ts, ntz) in out:
        assert type(ts) is datetime
        assert str(ts.tzinfo) == "America/New_York"
        assert type(ntz) is datetime
        assert ntz.tzinfo is None


def _count_flow(src, out: list) -> Dataflow:
    flow = Dataflow("ck_windows")
    clock = win.EventClock(lambda r: r["ts"], timedelta(seconds=10))
    windower = win.TumblingWindower(timedelta(minutes=1), datetime(2026, 1, 1, tzinfo=timezone.utc))
    w = win.count_window("count", op.input("inp", flow, src), clock, windower, lambda r: r["user"])
    op.output("out", w.down, TestingSink(out))
    return flow


def test_a_count_window_over_a_spark_keyed_file_stream_equals_in_memory(spark, tmp_path):
    """Per-user tumbling counts on an EventClock: every window the stream closed has the in-memory executor's count."""
    from flowspark.spark import run

    src_dir = str(tmp_path / "in")
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [{"user": f"u{i % 4}", "ts": base + timedelta(seconds=7 * i - 3 * (i % 3)), "ntz": base} for i in range(60)]
    _write_timed(src_dir, [{**r, "ntz": r["ntz"].replace(tzinfo=None)} for r in rows], 3)
    src = SparkSource(
        "parquet",
        src_dir,
        schema="user STRING, ts TIMESTAMP, ntz TIMESTAMP_NTZ",
        options={"maxFilesPerTrigger": "1"},
        streaming=True,
    )
    streamed: list = []
    # A clock standing still: the EventClock's watermark moves with event times only. On the
    # system clock it also moves with the seconds between micro-batches, and on a busy machine
    # it passed a window before the next file's events for it came (a short count, measured).
    clock = FileClock(str(tmp_path / "now.txt"))
    clock.set(T0)
    sr = run(
        _count_flow(src, streamed),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        progress=False,
        clock=clock,
    )
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    local: list = []
    run_main(_count_flow(TestingSource(rows), local))
    assert len(streamed) == len(set(streamed))
    assert streamed
    assert set(streamed) <= set(local)  # the stream closes the windows its watermarks passed, with their full counts
    # Every window that ends more than the wait before a user's last event is closed by the stream too.
    last = {u: max(r["ts"] for r in rows if r["user"] == u) for u in {r["user"] for r in rows}}
    closed = {
        (k, wid) for k, (wid, _n) in local if base + timedelta(minutes=wid + 1) <= last[k] - timedelta(seconds=10)
    }
    assert closed <= {(k, wid) for k, (wid, _n) in streamed}
