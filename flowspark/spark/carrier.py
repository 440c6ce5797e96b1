"""Carriers: flowspark's Python data sources, wrapped so Spark can plan them where flowspark is not installed.

flowspark ships itself to Python workers that lack it (`flowspark.spark.session.ensure_workers`:
`addPyFile` on a classic session, a Python artifact through Spark Connect). Spark hands
the zip to the tasks of batch jobs and of streaming queries (`mapInArrow`,
`applyInPandasWithState` and `transformWithStateInPandas` functions import flowspark
there), but not to the Python process that plans a streaming Python data source
(measured on Spark 4.3, both kinds of session: the query fails while Spark builds
its logical plan with `No module named 'flowspark'`). The
data sources (`flowspark.spark.io.pysource`) are then registered in carriers: classes
of this module, which pickle *by value* (this module imports nothing of flowspark
and is registered with cloudpickle as such), holding the flowspark zip and the real
class pickled. The first call in a Python process writes the zip to a temporary
file, puts it first on `sys.path`, then unpickles the real object and delegates
every call to it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from typing import Any

__all__ = ["carried_data_source", "register_by_value"]


def register_by_value() -> None:
    """Make pyspark's cloudpickle pickle this module's functions and classes by value."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _dumps(obj: Any) -> bytes:
    from pyspark import cloudpickle

    return cloudpickle.dumps(obj)


def _install(zip_blob: bytes) -> None:
    """Put the shipped flowspark first on `sys.path` (once per process and zip)."""
    digest = hashlib.sha256(zip_blob).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"flowspark-carried-{digest}.zip")
    if path in sys.path:
        return
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(zip_blob)
        os.replace(tmp, path)
    sys.path.insert(0, path)
    import importlib

    importlib.invalidate_caches()


def _unpickle(zip_blob: bytes, blob: bytes) -> Any:
    _install(zip_blob)
    return pickle.loads(blob)  # noqa: S301 - pickled by this job's own client


def carried_data_source(source_cls: type, zip_blob: bytes) -> type:
    """Wrap a Python streaming data source class (for `spark.dataSource.register`).

    The data source, its stream reader (pickled to every task that reads a partition)
    and the calls Spark makes on them are carried; the partitions are pyspark's own
    `InputPartition`s holding plain values.

    Args:
        source_cls: A `pyspark.sql.datasource.DataSource` subclass.
        zip_blob: The flowspark package as a zip.

    Returns:
        A `DataSource` subclass with the same name, schema and reader.
    """
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    cls_blob = _dumps(source_cls)
    name = source_cls.name()  # type: ignore[attr-defined]

    class CarriedReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, blob: bytes) -> None:
            self.blob = blob
            self.inner: Any = None

        def __getstate__(self) -> dict[str, Any]:
            # The reader as it is now (offsets it keeps), for the tasks that read partitions.
            return {"blob": self.blob if self.inner is None else _dumps(self.inner), "inner": None}

        def _r(self) -> Any:
            if self.inner is None:
                self.inner = _unpickle(zip_blob, self.blob)
            return self.inner

        def initialOffset(self) -> Any:  # noqa: N802
            return self._r().initialOffset()

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            self._r().prepareForTriggerAvailableNow()

        def latestOffset(self, start: Any, limit: Any) -> Any:  # noqa: N802
            return self._r().latestOffset(start, limit)

        def partitions(self, start: Any, end: Any) -> Any:
            return self._r().partitions(start, end)

        def read(self, partition: Any) -> Any:
            return self._r().read(partition)

        def commit(self, end: Any) -> None:
            self._r().commit(end)

        def stop(self) -> None:
            self._r().stop()

    class CarriedSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def _real(self) -> Any:
            return _unpickle(zip_blob, cls_blob)(self.options)

        def schema(self) -> Any:
            return self._real().schema()

        def streamReader(self, schema: Any) -> Any:  # noqa: N802
            return CarriedReader(_dumps(self._real().streamReader(schema)))

    return CarriedSource
