"""Fixtures of the Spark tests: the session-scoped Kafka broker (`tests/spark/kafka_broker.py`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """One one-node KRaft broker for the whole test session (fails, never skips, without Java or its jars)."""
    from kafka_broker import broker

    with broker(tmp_path_factory.mktemp("kafka")) as b:
        yield b
