"""Kafka end to end: flows read and write a real broker on Spark streaming, each equal to `run_main`.

Against the session's one-node KRaft broker (`kafka` fixture, `tests/spark/kafka_broker.py`)
and Spark's Kafka connector in the shared session (`spark.jars`: the jars
`scripts/fetch_jars.py` caches). Every query runs `available_now` over a few records; its
output, read back per key, equals the in-memory executor's over the same records (the
dicts the Kafka source gives, rebuilt from what a Kafka client reads).

Maven serves no connector for pyspark 4.3.0: there these tests skip, with the one command
that runs them (`python -m nox -s kafka`, pyspark 4.2.0). On a line with a connector, a
missing JDK, broker or connector fails them with the command to run.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

pyspark = pytest.importorskip("pyspark")

from flowspark.spark.io.kafka import (  # noqa: E402
    FETCH_JARS,
    KafkaSink,
    KafkaSource,
    connector_jars,
    connector_published,
)

if not connector_published():  # one skip for the module, with the command that runs it
    pytest.skip(
        f"Maven serves no Spark Kafka connector for pyspark {pyspark.__version__}; the Kafka end-to-end "
        "tests run on pyspark 4.2.0: python -m nox -s kafka",
        allow_module_level=True,
    )

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "streaming"
T0 = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)
HEADERS_SCHEMA = "key STRING, value STRING, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"


@pytest.fixture
def ks(spark, kafka):
    """The shared session with Spark's Kafka connector on its classpath, and the broker."""
    if connector_jars() is None:
        pytest.fail(
            f"Spark's Kafka connector for pyspark {pyspark.__version__} is not cached; run: "
            f"{sys.executable} {FETCH_JARS.split(' ', 1)[1]}",
            pytrace=False,
        )
    return spark, kafka


def _produce(kafka, topic: str, records: list[tuple[Any, Any, list[tuple[str, bytes]]]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for key, value, headers in records:
        producer.send(topic, key=_b(key), value=_b(value), headers=headers)
    producer.flush()
    producer.close()


def _b(x: Any) -> Any:
    return x.encode() if isinstance(x, str) else x


def _consume(kafka, topic: str) -> list[Any]:
    """Every record of `topic`, as the Kafka client reads it (each partition's in offset order)."""
    return kafka.read_topic(topic)


def _as_source_items(messages: list[Any], headers: bool = False) -> list[dict[str, Any]]:
    """The items `KafkaSource` gives for these records (what `run_main` reads)."""
    out = []
    for m in messages:
        item = {
            "topic": m.topic,
            "partition": m.partition,
            "offset": m.offset,
            "key": m.key,
            "value": m.value,
            "timestamp": datetime.fromtimestamp(m.timestamp / 1000, timezone.utc),
            "timestampType": m.timestamp_type,
        }
        if headers:
            item["headers"] = [{"key": k, "value": v} for k, v in m.headers]
        out.append(item)
    return out


def _kv(messages: list[Any]) -> dict[str, list[Any]]:
    """A sink topic's records per key: `{key: [decoded JSON values in order]}`."""
    return per_key((m.key.decode(), json.loads(m.value)) for m in messages)


def _run(flow, spark, chk: Path, **options):
    from flowspark.spark import run

    return run(flow, spark=spark, checkpoint=str(chk), trigger="available_now", progress=False, **options)


# -- keyed running count, Kafka -> Kafka: keys, headers, 3 partitions, two runs ------------------


def _event(record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    origin = {h["key"]: h["value"].decode() for h in record["headers"]}["origin"]
    return record["key"].decode(), {"seq": json.loads(record["value"])["seq"], "origin": origin}


def _count(total: Any, event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    total = (total or 0) + 1
    return total, {"n": total, **event}


def _count_record(kv: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    key, out = kv
    return {
        "key": key,
        "value": json.dumps(out, sort_keys=True),
        "headers": [{"key": "origin", "value": out["origin"].encode()}],
    }


def _count_flow(source: Any, sink: Any) -> Dataflow:
    flow = Dataflow("kafka_count")
    events = op.map("event", op.input("inp", flow, source), _event)
    op.output("out", op.map("record", op.stateful_map("count", events, _count), _count_record), sink)
    return flow


def _records(n: int, start: int = 0) -> list[tuple[str, str, list[tuple[str, bytes]]]]:
    return [(f"user{i % 5}", json.dumps({"seq": i}), [("origin", f"web{i % 2}".encode())]) for i in range(start, n)]


def test_running_count_kafka_to_kafka_keys_headers_3_partitions(ks, tmp_path):
    spark, kafka = ks
    src, dst = kafka.create_topic("count_in", partitions=3), kafka.create_topic("count_out")
    sink = KafkaSink(kafka.bootstrap, dst, schema=HEADERS_SCHEMA)
    flow = _count_flow(KafkaSource(kafka.bootstrap, src, options={"includeHeaders": "true"}), sink)
    _produce(kafka, src, _records(20))
    _run(flow, spark, tmp_path / "chk")
    _produce(kafka, src, _records(32, start=20))  # the second run goes on from the checkpoint's offsets
    _run(flow, spark, tmp_path / "chk")

    read = _consume(kafka, src)
    assert len({m.partition for m in read}) == 3
    out: list[Any] = []
    run_main(
        _count_flow(TestingSource([*_as_source_items(read, headers=True), TestingSource.ABORT()]), TestingSink(out))
    )
    written = _consume(kafka, dst)
    assert _kv(written) == {
        k: [json.loads(r["value"]) for r in v] for k, v in per_key((r["key"], r) for r in out).items()
    }
    assert sorted(json.loads(m.value)["n"] for m in written if m.key == b"user0") == list(range(1, 8))
    # each output record carries its header
    assert all(list(m.headers) == [("origin", json.loads(m.value)["origin"].encode())] for m in written)


# -- starting_offsets="latest": a new checkpoint reads only what arrives after its first run ------


def _plain_count_flow(source: Any, sink: Any) -> Dataflow:
    flow = Dataflow("kafka_latest")
    events = op.map("event", op.input("inp", flow, source), lambda r: (r["key"].decode(), json.loads(r["value"])))
    counts = op.stateful_map("count", events, lambda t, e: ((t or 0) + 1, {"n": (t or 0) + 1, "seq": e["seq"]}))
    op.output("out", op.map("record", counts, lambda kv: {"key": kv[0], "value": json.dumps(kv[1])}), sink)
    return flow


def test_starting_offsets_latest_and_earliest(ks, tmp_path):
    spark, kafka = ks
    src = kafka.create_topic("offsets_in")
    latest, earliest = kafka.create_topic("latest_out"), kafka.create_topic("earliest_out")
    _produce(kafka, src, _records(6))
    latest_flow = _plain_count_flow(
        KafkaSource(kafka.bootstrap, src, starting_offsets="latest"), KafkaSink(kafka.bootstrap, latest)
    )
    _run(latest_flow, spark, tmp_path / "latest")  # starts at the end: reads nothing
    _produce(kafka, src, _records(10, start=6))
    _run(latest_flow, spark, tmp_path / "latest")
    earliest_flow = _plain_count_flow(KafkaSource(kafka.bootstrap, src), KafkaSink(kafka.bootstrap, earliest))
    _run(earliest_flow, spark, tmp_path / "earliest")

    read = _consume(kafka, src)
    for topic, records in [(latest, read[6:]), (earliest, read)]:
        out: list[Any] = []
        run_main(_plain_count_flow(TestingSource(_as_source_items(records)), TestingSink(out)))
        assert _kv(_consume(kafka, topic)) == per_key((r["key"], json.loads(r["value"])) for r in out)
    assert sorted(json.loads(m.value)["seq"] for m in _consume(kafka, latest)) == [6, 7, 8, 9]


# -- sessions (notify_at) from Kafka into parquet ------------------------------------------------


def _load(name: str) -> Any:
    sys.path.insert(0, str(EXAMPLES))
    __import__(name)
    return sys.modules[name]


def _click(record: dict[str, Any]) -> dict[str, Any]:
    return json.loads(record["value"])


def _sessions_flow(source: Any, sink: Any) -> Dataflow:
    sessions = _load("sessions")
    flow = Dataflow("kafka_sessions")
    op.output("out", sessions.pipeline(op.map("click", op.input("inp", flow, source), _click)), sink)
    return flow


def _canon(rows: list[dict[str, Any]], key: str) -> dict[str, list[tuple]]:
    return {k: sorted(tuple(sorted(r.items())) for r in v) for k, v in per_key((r[key], r) for r in rows).items()}


def test_sessions_with_timeouts_kafka_to_parquet(ks, tmp_path):
    from flowspark.spark import SparkSink

    spark, kafka = ks
    sessions, common = _load("sessions"), _load("common")
    src = kafka.create_topic("clicks")
    sink = SparkSink("parquet", str(tmp_path / "out"), schema=sessions.OUT_SCHEMA)
    clock = common.FileClock(tmp_path / "now")
    for batch, at in [(sessions.BATCH_1, T0), (sessions.BATCH_2, T0 + timedelta(minutes=31))]:
        _produce(kafka, src, [(c["user"], json.dumps(c), []) for c in batch])
        clock.set(at)
        _run(_sessions_flow(KafkaSource(kafka.bootstrap, src), sink), spark, tmp_path / "chk", clock=clock)
    streamed = common.read_rows(tmp_path / "out")

    read = _as_source_items(_consume(kafka, src))
    n1 = len(sessions.BATCH_1)
    events = [*read[:n1], TestingSource.PAUSE(timedelta(minutes=31)), *read[n1:], TestingSource.ABORT()]
    local: list[Any] = []
    run_main(
        _sessions_flow(TestingSource(events), TestingSink(local)), clock="logical", start_time=T0, roundtrip_state=True
    )
    assert _canon(streamed, "user") == _canon(local, "user")
    # run 1's sessions time out 31 minutes later, in run 2; run 2's stay open
    assert sorted(r["user"] for r in streamed) == ["ann", "bob", "cid"]


# -- tumbling windows with a late stream, both to Kafka ------------------------------------------


def _trade(record: dict[str, Any]) -> dict[str, Any]:
    return json.loads(record["value"])


def _windows_flow(source: Any, profits_sink: Any, late_sink: Any) -> Dataflow:
    trades = _load("trades")
    flow = Dataflow("kafka_trades")
    profits, late = trades.pipeline(op.map("trade", op.input("inp", flow, source), _trade))
    op.output("profits", op.map("profit_record", profits, _symbol_record), profits_sink)
    op.output("late", op.map("late_record", late, _symbol_record), late_sink)
    return flow


def _symbol_record(row: dict[str, Any]) -> dict[str, Any]:
    return {"key": row["symbol"], "value": json.dumps(row, sort_keys=True)}


def test_tumbling_windows_with_late_trades_kafka_to_kafka(ks, tmp_path):
    spark, kafka = ks
    trades, common = _load("trades"), _load("common")
    src, profits, late = kafka.create_topic("trades"), kafka.create_topic("profits"), kafka.create_topic("late")
    clock = common.FileClock(tmp_path / "now")
    clock.set(T0)  # system time stands still: the watermark moves with event time only
    flow = _windows_flow(
        KafkaSource(kafka.bootstrap, src), KafkaSink(kafka.bootstrap, profits), KafkaSink(kafka.bootstrap, late)
    )
    for batch in (trades.BATCH_1, trades.BATCH_2):
        _produce(kafka, src, [(t["symbol"], json.dumps(t), []) for t in batch])
        _run(flow, spark, tmp_path / "chk", clock=clock)

    records = [*_as_source_items(_consume(kafka, src)), TestingSource.ABORT()]
    local_p: list[Any] = []
    local_l: list[Any] = []
    run_main(
        _windows_flow(TestingSource(records), TestingSink(local_p), TestingSink(local_l)),
        clock="logical",
        start_time=T0,
    )
    for topic, local in [(profits, local_p), (late, local_l)]:
        assert _kv(_consume(kafka, topic)) == per_key((r["key"], json.loads(r["value"])) for r in local)
    assert [json.loads(m.value)["trade_time"] for m in _consume(kafka, late)] == ["2024-05-01T09:01:00+00:00"]
    assert len(_consume(kafka, profits)) == 3


# -- bad records: a value the deserializer rejects ----------------------------------------------


def _bad_records_flow(source: Any, sink: Any) -> Dataflow:
    flow = Dataflow("kafka_bad")
    events = op.map("parse", op.input("inp", flow, source), lambda r: (r["key"].decode(), json.loads(r["value"])))
    op.output("out", op.map("record", events, lambda kv: {"key": kv[0], "value": json.dumps(kv[1])}), sink)
    return flow


BAD = b"\xff{not json"


def test_a_bad_value_goes_to_the_dead_letter_with_its_bytes_topic_partition_offset(ks, tmp_path):
    from flowspark.deadletter import DeadLetterDir

    spark, kafka = ks
    src, dst = kafka.create_topic("bad_in"), kafka.create_topic("bad_out")
    _produce(kafka, src, [("a", '{"n": 1}', []), ("b", BAD, []), ("a", '{"n": 2}', [])])
    flow = _bad_records_flow(KafkaSource(kafka.bootstrap, src), KafkaSink(kafka.bootstrap, dst))
    _run(flow, spark, tmp_path / "chk", dead_letter=DeadLetterDir(str(tmp_path / "dead")))

    (dead,) = spark.read.parquet(str(tmp_path / "dead")).collect()
    assert (dead.step_id, dead.error_type) == ("kafka_bad.parse.flat_map_batch", "UnicodeDecodeError")
    assert dead.item.startswith(f"{{'topic': '{src}', 'partition': 0, 'offset': 1, 'key': b'b', 'value': {BAD!r}")
    assert _kv(_consume(kafka, dst)) == {"a": [{"n": 1}, {"n": 2}]}


def test_a_bad_value_without_dead_letter_stops_naming_step_topic_partition_offset(ks, tmp_path):
    spark, kafka = ks
    src, dst = kafka.create_topic("bad2_in"), kafka.create_topic("bad2_out")
    _produce(kafka, src, [("a", '{"n": 1}', []), ("b", BAD, [])])
    flow = _bad_records_flow(KafkaSource(kafka.bootstrap, src), KafkaSink(kafka.bootstrap, dst))
    with pytest.raises(FlowsparkRuntimeError) as info:
        _run(flow, spark, tmp_path / "chk")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("error in step 'kafka_bad.parse.flat_map_batch': UnicodeDecodeError: ")
    assert f"{{'topic': '{src}', 'partition': 0, 'offset': 1," in text
    assert "Py4J" not in text
    assert "at org.apache" not in text


# -- the example users copy ----------------------------------------------------------------------


def test_kafka_anomalies_example(ks, tmp_path):
    spark, kafka = ks
    example, anomalies = _load("kafka_anomalies"), _load("anomalies")
    metrics, alerts = kafka.create_topic("metrics"), kafka.create_topic("alerts")
    readings = [*anomalies.BATCH_1, *anomalies.BATCH_2]
    _produce(kafka, metrics, [(r["sensor"], json.dumps(r), []) for r in readings[:-1]])
    _produce(kafka, metrics, [("s9", b"not json", [])])
    _produce(kafka, metrics, [(r["sensor"], json.dumps(r), []) for r in readings[-1:]])
    example.run(example.streaming(kafka.bootstrap, metrics, alerts), tmp_path, spark=spark, progress=False)

    read = _as_source_items(_consume(kafka, metrics))
    good = [r for r in read if r["value"] != b"not json"]
    out: list[Any] = []
    run_main(example.local([*good, TestingSource.ABORT()], out))
    streamed = _kv(_consume(kafka, alerts))
    assert streamed == per_key((r["key"], json.loads(r["value"])) for r in out)
    assert sorted(streamed) == ["s1", "s2"]
    (dead,) = spark.read.parquet(str(tmp_path / "dead")).collect()
    assert dead.step_id == "kafka_anomalies.reading.flat_map_batch"
    assert f"'topic': '{metrics}', 'partition': 0, 'offset': {len(readings) - 1}," in dead.item


# -- kill -9 of the driver mid-stream, restart from the checkpoint -------------------------------


def _end_offsets(consumer, topic: str) -> int:
    """How many records `topic` holds (the sum of its partitions' end offsets)."""
    from kafka import TopicPartition

    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    return sum(consumer.end_offsets(parts).values()) if parts else 0


def test_kill_9_three_times_then_restart_state_exact_kafka_sink_at_least_once(ks, tmp_path):
    """What a consumer of the sink topic sees after crashes: every count once or more, none skipped.

    A record is written twice only when a kill lands after its micro-batch wrote to the topic and
    before the checkpoint committed it: the restart runs that micro-batch again. Each of the three
    kills is aimed at that window (the topic holds records past the committed micro-batches' 50
    each), after the run committed a micro-batch of its own; a kill the window escapes (it lasts
    from the Kafka write to the commit, tens of milliseconds) lands between micro-batches and
    duplicates nothing. So the duplicates are exactly the records in flight at the aimed kills,
    at most 50 per kill, each written at most twice.
    """
    import os
    import signal
    import subprocess
    import time
    from collections import Counter

    import kafka_driver
    from kafka import KafkaConsumer

    spark, kafka = ks
    src, dst = kafka.create_topic("kill_in"), kafka.create_topic("kill_out")
    _produce(kafka, src, [(f"user{i % 6}", json.dumps({"i": i}), []) for i in range(900)])
    chk = tmp_path / "chk"
    commits = chk / "query" / "commits"
    script = Path(__file__).with_name("kafka_driver.py")
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)

    def committed() -> int:
        return len([f for f in os.listdir(commits) if f.isdigit()]) if commits.is_dir() else 0

    in_flight_at_kills = []
    replayed = 0  # records of replayed micro-batches already in the topic before their replay
    for _kill in range(3):
        start = committed()
        proc = subprocess.Popen(
            [sys.executable, str(script), kafka.bootstrap, src, dst, str(chk)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 240
        in_flight = 0
        while proc.poll() is None and time.monotonic() < deadline:
            done = committed()
            if done > start:
                in_flight = _end_offsets(consumer, dst) - replayed - 50 * done
                if in_flight > 0 or done >= start + 4:  # aimed, or the window escaped four times
                    break
            time.sleep(0.005)
        alive = proc.poll() is None
        if alive:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert alive, "the driver ended before it could be killed; produce more records"
        in_flight = max(in_flight, 0)
        in_flight_at_kills.append(in_flight)
        replayed += _end_offsets(consumer, dst) - replayed - 50 * committed()  # what the kill left uncommitted
    consumer.close()
    assert committed() < 18, "every micro-batch was committed before the last kill"
    _run(kafka_driver.build(kafka.bootstrap, src, dst), spark, chk)

    got = Counter((m.key.decode(), json.loads(m.value)) for m in _consume(kafka, dst))
    # state exact: each key counted 1..150, none skipped, none counted twice
    assert set(got) == {(f"user{k}", n) for k in range(6) for n in range(1, 151)}
    # at least once: a replayed micro-batch's records are written twice, never more
    extra = sum(got.values()) - len(got)
    assert max(got.values()) <= 2
    assert extra == replayed, (extra, replayed, in_flight_at_kills)
    assert extra <= 3 * 50
    assert any(n > 0 for n in in_flight_at_kills), f"no kill landed in a write-to-commit window: {in_flight_at_kills}"


# -- a partition added to the topic while the query runs ------------------------------------------


def test_a_partition_added_mid_stream_is_picked_up(ks, tmp_path):
    """A running query (a processing-time trigger) reads a partition added to its topic, from its first record."""
    import threading
    import time

    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewPartitions

    from flowspark.spark import run

    spark, kafka = ks
    src, dst = kafka.create_topic("grow_in", partitions=2), kafka.create_topic("grow_out")
    flow = _plain_count_flow(KafkaSource(kafka.bootstrap, src), KafkaSink(kafka.bootstrap, dst))
    _produce(kafka, src, _records(10))
    failed: list[BaseException] = []

    def stream() -> None:
        try:
            run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="1 second", progress=False, timeout=240)
        except BaseException as e:  # noqa: BLE001 (the test thread reports it)
            failed.append(e)

    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)

    def wait_for(n: int) -> int:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not failed and _end_offsets(consumer, dst) < n:
            time.sleep(0.1)
        return _end_offsets(consumer, dst)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert wait_for(10) == 10, failed
        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        admin.create_partitions({src: NewPartitions(3)})
        admin.close()
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
        for i in range(10, 16):  # keys of their own, only in the new partition
            producer.send(src, key=f"late{i % 2}".encode(), value=json.dumps({"seq": i}).encode(), partition=2)
        producer.flush()
        producer.close()
        assert wait_for(16) == 16, failed
    finally:
        for q in spark.streams.active:
            q.stop()
        thread.join(timeout=120)
        consumer.close()
    assert not failed, failed
    read = sorted(_consume(kafka, src), key=lambda m: (m.partition, m.offset))
    assert [m.offset for m in read if m.partition == 2] == list(range(6))
    out: list[Any] = []
    run_main(_plain_count_flow(TestingSource(_as_source_items(read)), TestingSink(out)))
    assert _kv(_consume(kafka, dst)) == per_key((r["key"], json.loads(r["value"])) for r in out)


# -- the broker goes away while the query runs -----------------------------------------------------

# Spark's Kafka source asks the broker for offsets with an admin client whose calls wait
# `default.api.timeout.ms` (Kafka's default: 60 s), `fetchOffset.numRetries` times (Spark's
# default: 3); shortened here so that the query gives up in seconds, not minutes.
LOSS_OPTIONS = {
    "kafka.default.api.timeout.ms": "10000",
    "kafka.request.timeout.ms": "5000",
    "fetchOffset.numRetries": "1",
}
# The JVM's own start-up lines, printed before any session setting applies.
JVM_START = ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level")


def test_a_broker_gone_mid_stream_stops_the_run_with_one_line(tmp_path):
    """Kill -9 the broker (a private one: the session's broker serves the other tests) under a running query."""
    import os
    import signal
    import subprocess
    import time

    from kafka import KafkaConsumer
    from kafka_broker import broker

    if connector_jars() is None:
        pytest.fail(f"Spark's Kafka connector is not cached; run: {sys.executable} {FETCH_JARS.split(' ', 1)[1]}")
    (tmp_path / "kafka").mkdir()
    script = Path(__file__).with_name("kafka_loss_driver.py")
    stderr = tmp_path / "stderr"
    with broker(tmp_path / "kafka") as kb:
        src, dst = kb.create_topic("loss_in", partitions=3), kb.create_topic("loss_out")
        _produce(kb, src, [(f"user{i % 3}", json.dumps({"i": i}), []) for i in range(30)])
        opts = [f"{k}={v}" for k, v in LOSS_OPTIONS.items()]
        with stderr.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, str(script), kb.bootstrap, src, dst, str(tmp_path / "chk"), "400", *opts],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        consumer = KafkaConsumer(bootstrap_servers=kb.bootstrap)
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline and _end_offsets(consumer, dst) < 30:
            time.sleep(0.2)
        written = _end_offsets(consumer, dst)
        consumer.close()
        assert written == 30, stderr.read_text()  # the query ran: its first micro-batch is in the sink topic
        os.kill(kb.pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            proc.wait(timeout=420)
        finally:
            if proc.poll() is None:
                proc.kill()
        took = time.monotonic() - killed
    lines = [ln for ln in stderr.read_text().splitlines() if ln.strip() and not ln.startswith(JVM_START)]
    assert len(lines) == 1, stderr.read_text()
    (line,) = lines
    assert proc.returncode == 1, (proc.returncode, line)
    assert line.startswith(f"failed: step 'kafka_loss.inp' (KafkaSource('{kb.bootstrap}', '{src}')): "), line
    assert f"the Kafka broker at {kb.bootstrap} is unreachable" in line, line
    assert "TimeoutException" in line, line
    assert took < 120, f"the run ended {took:.0f} s after the broker died: {line}"
