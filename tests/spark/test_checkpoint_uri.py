"""A streaming checkpoint given as a URI: flowspark's own files go through Hadoop's file system, like Spark's.

Hadoop opens `file:` URIs; the tests send them through the Hadoop path (as `s3a://` or
`hdfs://` checkpoints go) by narrowing the schemes flowspark opens with `os`.
"""

from __future__ import annotations

import json
import os

import pytest
from streaming_helpers import JsonlDirSource, count_mapper, write_jsonl

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.deadletter import DeadLetterDir
from flowspark.errors import FlowsparkTypeError, RecoveryError
from flowspark.spark.streaming import ckfs
from flowspark.testing import TestingSink, per_key, run_main

pytestmark = [pytest.mark.spark]


def _flow(root: str, out: list, flow_id: str = "uri_count", bounded: bool = False) -> Dataflow:
    flow = Dataflow(flow_id)
    s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"], bounded=bounded))
    keyed = op.key_on("key", s, lambda e: e["user"])
    op.output("out", op.stateful_map("count", keyed, count_mapper), TestingSink(out))
    return flow


@pytest.fixture
def hadoop_only(monkeypatch, tmp_path):
    """`file:` URIs go through Hadoop; a stray local write would land under the working directory."""
    monkeypatch.setattr(ckfs, "_LOCAL_SCHEMES", ("",))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_hadoop_files_read_write_list_delete(spark, tmp_path, hadoop_only):
    base = f"file://{tmp_path}/h"
    fs = ckfs.files(base, spark)
    assert type(fs).__name__ == "_HadoopFiles"
    path = ckfs.join(base, "d", "meta.json")
    assert not fs.exists(path)
    fs.write_text(path, '{"a": 1}')
    fs.write_text(path, '{"a": 2}')  # replaced
    assert fs.read_text(path) == '{"a": 2}'
    assert fs.isdir(ckfs.join(base, "d"))
    assert not fs.isdir(path)
    assert [n for n in fs.listdir(ckfs.join(base, "d")) if not n.startswith(".")] == ["meta.json"]
    fs.rmtree(ckfs.join(base, "d"))
    assert not fs.exists(path)
    assert fs.listdir(ckfs.join(base, "d")) == []
    assert os.listdir(hadoop_only) == []


def test_stream_with_a_uri_checkpoint_resumes_and_refuses_another_flow(spark, tmp_path, hadoop_only):
    from flowspark.spark import run
    from flowspark.spark.tools import read_state

    root = str(tmp_path / "in")
    chk = f"file://{tmp_path}/chk"
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(5)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": "u1"}])
    first: list = []
    run(_flow(root, first), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u0"}, {"user": "u3"}])
    second: list = []
    run(_flow(root, second), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    expected: list = []
    run_main(_flow(root, expected, bounded=True))
    assert per_key(first + second) == per_key(expected)
    assert len(second) == 2  # the restart went on from the checkpoint
    # flowspark's own file sits next to Spark's, in the checkpoint, not under the working directory.
    meta = json.loads((tmp_path / "chk" / "flowspark.json").read_text())
    assert meta["flow_id"] == "uri_count"
    assert os.listdir(hadoop_only) == []
    meta, table = read_state(spark, chk)
    assert {k: ent[0][0][0] for k, ent in table.items()} == {"u0": 3, "u1": 3, "u2": 1, "u3": 1}
    with pytest.raises(RecoveryError, match="belongs to dataflow 'uri_count'"):
        run(_flow(root, [], "other"), spark=spark, checkpoint=chk, trigger="available_now", progress=False)


def test_a_stream_refuses_a_dead_letter_dir_that_python_cannot_open(spark, tmp_path, hadoop_only):
    from flowspark.spark import run

    with pytest.raises(FlowsparkTypeError, match=r"DeadLetterDir is written by Python.*'file://"):
        run(
            _flow(str(tmp_path / "in"), []),
            spark=spark,
            checkpoint=str(tmp_path / "chk"),
            trigger="available_now",
            dead_letter=DeadLetterDir(f"file://{tmp_path}/dead"),
        )


def test_connect_needs_a_checkpoint_it_can_open(monkeypatch):
    import flowspark.spark.session as session

    monkeypatch.setattr(session, "is_connect", lambda spark: True)
    with pytest.raises(FlowsparkTypeError, match=r"'s3a://b/chk' is not a local path; through Spark Connect"):
        ckfs.check_reachable(object(), "s3a://b/chk")
    ckfs.check_reachable(object(), "/mnt/shared/chk")  # a path without a scheme is fine
