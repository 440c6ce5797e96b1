"""The outbox: how a stream hands its driver-side outputs to this process when Spark runs elsewhere.

On a classic session the query's `foreachBatch` function runs in this process and
hands each micro-batch's items to `TestingSink`, the Python sinks, `inspect` and
the dead letter. Through Spark Connect, `foreachBatch` runs in a Python process
of the *server*: a sink's list, a file the sink writes, a line `inspect` prints
would land there, not here. So on a Connect session those outputs go through an
outbox instead:

- the query writes the `(st, p, seq, v)` rows of those outputs, stamped with their
  micro-batch id `b`, with Spark's parquet file sink to `<checkpoint>/outbox`,
  partitioned by `b`: exactly once, committed with the micro-batch;
- this process reads the committed micro-batches it has not handed over yet
  (`spark.read.parquet` of a file sink's folder reads only what its metadata log
  committed), in batch order, and hands their items over as `foreachBatch` would;
  `<checkpoint>/outbox-delivered.json` records the last batch handed over, and the
  folder of a batch handed over is deleted.

Delivery is at-least-once, as with `foreachBatch`: a batch whose items were handed
over but not yet recorded (the process died in between) is handed over again by
the next run, which first delivers whatever the previous run left in the outbox.
The checkpoint directory must be reachable from this process (a local path, or a
volume mounted on both sides), as for the rest of flowspark's checkpoint metadata.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from flowspark.spark.compat import to_arrow
from flowspark.spark.streaming.ckfs import files, join
from flowspark.spark.streaming.deadletter import task_batch_id

__all__ = ["OUTBOX_SCHEMA", "Outbox", "stamp_batch"]

#: The rows the query writes to the outbox.
OUTBOX_SCHEMA = "st int, p int, seq binary, v binary, b long"


def stamp_batch(batches: Iterator[Any]) -> Iterator[Any]:
    """`(st, p, seq, v)` Arrow batches -> the same rows with `b`, the running micro-batch's id."""
    import pyarrow as pa

    b = task_batch_id()
    for batch in batches:
        if batch.num_rows:
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array([b] * batch.num_rows, pa.int64())], names=["st", "p", "seq", "v", "b"]
            )


class Outbox:
    """The outbox of one checkpoint (see the module's doc).

    Args:
        spark: The SparkSession (classic or Connect).
        checkpoint: The run's checkpoint directory.
    """

    def __init__(self, spark: Any, checkpoint: str) -> None:
        self.spark = spark
        self.path = join(checkpoint, "outbox")
        self.marker = join(checkpoint, "outbox-delivered.json")
        #: The checkpoint's file calls (`ckfs`: a Connect client's checkpoint is a path it can open).
        self.fs = files(checkpoint)
        #: Held while batches are handed over (the listener's thread and the run's thread both deliver).
        self.lock = threading.RLock()

    def exists(self) -> bool:
        """Whether a query ever committed to this outbox."""
        return bool(self.fs.isdir(join(self.path, "_spark_metadata")))

    def delivered(self) -> int:
        """The id of the last micro-batch handed over (-1: none)."""
        if not self.fs.exists(self.marker):
            return -1
        return int(json.loads(self.fs.read_text(self.marker))["batch"])

    def writer(self, rows: Any) -> Any:
        """The `DataStreamWriter` of the query's outbox rows (`(st, p, seq, v)` rows in)."""
        stamped = rows.mapInArrow(stamp_batch, OUTBOX_SCHEMA)
        return stamped.writeStream.format("parquet").option("path", self.path).partitionBy("b").outputMode("append")

    def pending(self) -> list[tuple[int, Any]]:
        """The committed micro-batches not handed over yet: `(batch id, Arrow table of st, p, seq, v)`, in order."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as F  # noqa: N812

        if not self.exists():
            return []
        done = self.delivered()
        reader = self.spark.read.schema(OUTBOX_SCHEMA).option("ignoreMissingFiles", "true")
        df = reader.parquet(self.path).filter(F.col("b") > done)
        table = to_arrow(df.select("st", "p", "seq", "v", "b"))
        if not table.num_rows:
            return []
        out = []
        ids = table.column("b")
        for b in sorted(set(ids.to_pylist())):
            out.append((int(b), table.filter(pc.equal(ids, b)).select(["st", "p", "seq", "v"])))
        return out

    def done(self, batch_id: int) -> None:
        """Record that micro-batch `batch_id` was handed over; delete its folder."""
        self.fs.write_text(self.marker, json.dumps({"batch": batch_id}))
        self.fs.rmtree(join(self.path, f"b={batch_id}"))
