"""The tests' Kafka broker: a real one-node KRaft broker, records with keys and headers round-trip."""

from __future__ import annotations

import pytest

# Part of the Spark suite (the broker serves the Kafka flows), out of the fast loop; kafka-python
# imports resources the old way (a DeprecationWarning per call, not ours to fix).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
]


def test_broker_round_trips_keys_headers_and_partitions(kafka):
    from kafka import KafkaProducer

    topic = kafka.create_topic("round_trip", partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    sent = [(f"k{i % 4}".encode(), f"v{i}".encode(), [("n", str(i).encode())]) for i in range(12)]
    for key, value, headers in sent:
        producer.send(topic, key=key, value=value, headers=headers)
    producer.flush()
    producer.close()
    got = [(m.key, m.value, list(m.headers), m.partition) for m in kafka.read_topic(topic)]
    assert sorted(g[:3] for g in got) == sorted((k, v, h) for k, v, h in sent)
    # the default partitioner keeps each key in one partition, and the 3 partitions are used
    by_key = {}
    for key, _, _, partition in got:
        by_key.setdefault(key, set()).add(partition)
    assert all(len(p) == 1 for p in by_key.values())
    assert len({g[3] for g in got}) > 1
