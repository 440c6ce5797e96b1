"""The checkpoint's own small files, on whatever file system the checkpoint is on.

flowspark keeps a few files next to Spark's in a streaming checkpoint
(`flowspark.json`, the state counts, the outbox's bookkeeping). A checkpoint path
without a scheme (or a `file:` URI) is a local directory: plain `os` calls. Any
other scheme (`hdfs://`, `s3a://`, `abfss://`, `dbfs:/`, ...) is opened with the
Hadoop `FileSystem` of the driver's classic SparkSession, the one Spark itself
uses for the checkpoint, so those files live where Spark's offsets and state live.
A Spark Connect client has no file-system API: it needs a checkpoint it can open
itself (`check_reachable`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any, Optional
from urllib.parse import urlparse

from flowspark._paths import is_local as _is_local
from flowspark.errors import FlowsparkTypeError
from flowspark.spark.compat import default_session, hadoop_configuration, hadoop_path, read_utf8

__all__ = ["check_reachable", "files", "is_local", "join"]

#: Schemes opened with `os` (tests narrow it to send `file:` URIs through Hadoop).
_LOCAL_SCHEMES: tuple[str, ...] = ("", "file")


def is_local(path: str) -> bool:
    """Whether `path` is a local directory (no scheme, or `file:`).

    Example:
        >>> is_local("/data/chk"), is_local("file:///data/chk"), is_local("s3a://bucket/chk")
        (True, True, False)
    """
    return _is_local(path, _LOCAL_SCHEMES)


def _local(path: str) -> str:
    u = urlparse(path)
    return u.path if u.scheme == "file" else path


def join(base: str, *names: str) -> str:
    """`base/name/...` for local paths and URIs alike."""
    return "/".join([base.rstrip("/"), *names]) if not is_local(base) else os.path.join(base, *names)


def check_reachable(spark: Any, checkpoint: str) -> None:
    """Refuse a checkpoint this process cannot open through `spark` (a Connect session and a URI).

    Raises:
        FlowsparkTypeError: One line saying which checkpoint works.
    """
    from flowspark.spark.session import is_connect

    if not is_local(checkpoint) and is_connect(spark):
        msg = (
            f"flowspark.spark.run: checkpoint {checkpoint!r} is not a local path; through Spark Connect "
            "flowspark reads and writes its own files in the checkpoint (flowspark.json, the outbox's "
            "bookkeeping) from this process, which has no file-system API on the server: give a directory "
            "both the server and this process can open (a path without a scheme, e.g. a shared mount)"
        )
        raise FlowsparkTypeError(msg)


class _LocalFiles:
    def exists(self, path: str) -> bool:
        return os.path.exists(_local(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(_local(path))

    def read_text(self, path: str) -> str:
        with open(_local(path), encoding="utf-8") as f:
            return f.read()

    def write_text(self, path: str, text: str) -> None:
        p = _local(path)
        os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
        tmp = f"{p}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(_local(path)) if os.path.isdir(_local(path)) else []

    def rmtree(self, path: str) -> None:
        shutil.rmtree(_local(path), ignore_errors=True)


class _HadoopFiles:
    """The same calls through Hadoop's `FileSystem` (py4j, classic sessions)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.conf = hadoop_configuration(spark)

    def _fs(self, path: str) -> tuple[Any, Any]:
        p = hadoop_path(self.spark, path)
        return p.getFileSystem(self.conf), p

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def isdir(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p) and fs.getFileStatus(p).isDirectory())

    def read_text(self, path: str) -> str:
        fs, p = self._fs(path)
        stream = fs.open(p)
        try:
            return read_utf8(self.spark, stream)
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        # Written aside, then renamed over the old file (a reader never sees half a file).
        fs, p = self._fs(path)
        tmp = hadoop_path(self.spark, f"{path}.{uuid.uuid4().hex}.tmp")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        if fs.exists(p):
            fs.delete(p, False)
        if not fs.rename(tmp, p):
            msg = f"could not rename {tmp} to {path}"
            raise OSError(msg)

    def listdir(self, path: str) -> list[str]:
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        return [str(s.getPath().getName()) for s in fs.listStatus(p)]

    def rmtree(self, path: str) -> None:
        fs, p = self._fs(path)
        if fs.exists(p):
            fs.delete(p, True)


def files(path: str, spark: Optional[Any] = None) -> Any:
    """The file calls for `path`: `os` for a local path, else Hadoop's through the classic session.

    Args:
        path: A path in (or the root of) the checkpoint.
        spark: The session (default: the active classic session).

    Returns:
        An object with `exists`, `isdir`, `read_text`, `write_text`, `listdir`, `rmtree`.

    Raises:
        FlowsparkTypeError: A URI and no classic session to open it with.
    """
    if is_local(path):
        return _LocalFiles()
    if spark is None:
        spark = default_session()
    from flowspark.spark.session import is_connect

    if spark is None or is_connect(spark):
        msg = (
            f"checkpoint {path!r} is not a local path and there is no classic SparkSession to open it with "
            "(Hadoop's file systems); start one first, or use a local or mounted directory"
        )
        raise FlowsparkTypeError(msg)
    return _HadoopFiles(spark)
