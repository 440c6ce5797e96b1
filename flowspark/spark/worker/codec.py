"""How items, sequences and errors travel between the driver and Spark's Python workers.

- **Items** (`dumps` / `loads`): marshal for atomic values, pickle otherwise.
- **Sequences**: bytes that sort (unsigned, lexicographically) in the order the
  items must be processed. A source stamps 20 bytes `>QIII`: the *activation*,
  then the source index, the source partition and the item's offset in its
  activation. An activation is what Bytewax's single worker handles in one go:
  batch `i` of every partition of every source (`next_batch` number `i` of a
  partition; `TestingSource`'s batches of `batch_size` items), so sorting by
  sequence polls partitions and sources in turn, as Bytewax does. Streaming
  sources stamp one activation per item; a `SparkSource`'s rows are one activation
  (offset: the row's position in its Spark partition). Every `flat_map_batch`
  appends one `>I` component (the index of the output among the outputs of its
  input item; steps the IR marks `one_to_one` keep the input's sequence); a
  stateful step moves its key in right after the activation
  (`flowspark.runtime.tags.regroup`) and appends one component (the index of the
  emit among the emits caused by one input value), so an activation's emits sort
  by key in sorted key order, as Bytewax groups an activation by key before a
  stateful step. Emits at the end of a key (notifications due after the last
  value, then `on_eof`) get the activation `EOF_HEADER + level` (`level`: the
  number of stateful steps on the longest path from a source to this step, so it
  is above every activation the step's input can carry), then the key
  (`flowspark.runtime.tags.eof_tag`), and indexes from `EOF_BASE` on: they sort
  after every item emitted while input flowed, and keys end in sorted key order,
  as in Bytewax and the in-memory executor. A merge inserts the upstream's index
  right after the activation and pads the sequence to the longest upstream's
  length, so the items of one activation come upstream by upstream, as in the
  in-memory executor's passes. Keys are encoded prefix-free
  (`flowspark.runtime.tags.key_tag`), so comparisons are decided inside the
  first component that differs and never reach the padding; sorting by sequence
  gives the order of `run_main(clock="fixed")` and, within a key, exactly.
- **Errors** (`encode_task_error` / `decode_task_error`): a marker that carries a
  `FlowsparkRuntimeError` through Spark's (Java) exception chain to the driver. A
  malformed input row is reported by Spark itself (`raise_error`, no Python worker),
  with a marker of hex fields built in SQL (`MALFORMED_MARK`).
"""

from __future__ import annotations

import base64
import marshal
import pickle
import re
import struct
import sys
from collections.abc import Iterator
from typing import Any, Optional

import cloudpickle

from flowspark.errors import FlowsparkRuntimeError, FlowsparkRuntimeTypeError, malformed_input_error
from flowspark.runtime.tags import EOF_BASE, EOF_HEADER, HEAD_LEN, SOURCE_LEN, idx
from flowspark.spark.compat import rebuilt_by_value

__all__ = [
    "EOF_BASE",
    "SINGLES",
    "EOF_HEADER",
    "HEAD_LEN",
    "CAUSE_LIMIT",
    "MALFORMED_MARK",
    "apply_pad",
    "chunk_bounds",
    "decode_task_error",
    "dumps",
    "encode_task_error",
    "idx",
    "loads",
    "loads_all",
    "loads_arrow",
    "binary_buffers",
    "position_seqs",
    "read_head",
    "source_items",
    "source_seq",
]

_HEAD = struct.Struct(">QIII")
_PACK_SRC = _HEAD.pack
#: `per_batch` for a source stamped item by item (streaming): each item is an activation.
SINGLES = 1


def source_items(
    source_index: int, partition: int, activation: int, xs: list[Any], offset: int = 0, per_batch: int = 0
) -> list[tuple[bytes, Any]]:
    """Stamp consecutive items of one source partition with their sequences.

    Args:
        source_index: Index of the input step in the flow.
        partition: Index of the source partition.
        activation: Activation (source batch) of the first item.
        xs: The items.
        offset: Offset of the first item in its activation.
        per_batch: Items per activation from the first item's on (`SINGLES`: each item
            is an activation of its own); `0`: all of `xs` belong to `activation`.

    Returns:
        `(sequence, item)` pairs in order.

    Example:
        >>> [s for s, _ in source_items(0, 0, 7, "abc", offset=1, per_batch=2)] == [
        ...     source_seq(0, 0, 7, 1), source_seq(0, 0, 8, 0), source_seq(0, 0, 8, 1)]
        True
    """
    n = len(xs)
    if n < 16:
        if per_batch == 0:
            return [(_PACK_SRC(activation, source_index, partition, offset + i), x) for i, x in enumerate(xs)]
        return [
            (_PACK_SRC(activation + (offset + i) // per_batch, source_index, partition, (offset + i) % per_batch), x)
            for i, x in enumerate(xs)
        ]
    import numpy as np

    at = np.arange(offset, offset + n, dtype=np.uint64)
    if per_batch == 0:
        seqs = _packed(source_index, partition, activation, at)
    else:
        seqs = _packed(source_index, partition, activation + at // per_batch, at % per_batch)
    return list(zip(seqs, xs, strict=True))


_SEQ_DTYPE = [("a", ">u8"), ("s", ">u4"), ("p", ">u4"), ("o", ">u4")]
_POSITION_BITS = 33


def _packed(source_index: int, partitions: Any, activations: Any, offsets: Any) -> list[bytes]:
    """`source_seq` for many items at once (numpy): each field is a scalar or an array."""
    import numpy as np

    n = len(offsets) if np.ndim(offsets) else len(activations)
    arr = np.empty(n, dtype=_SEQ_DTYPE)
    arr["s"] = source_index
    arr["p"] = partitions
    arr["a"] = activations
    arr["o"] = offsets
    buf = arr.tobytes()
    return [buf[i : i + SOURCE_LEN] for i in range(0, n * SOURCE_LEN, SOURCE_LEN)]


def position_seqs(source_index: int, ids: Any) -> list[bytes]:
    """The sequences of rows numbered by Spark's `monotonically_increasing_id()`.

    That id is `partition << 33 | row position in the partition`; a `SparkSource`'s
    rows are one activation (sequences sort as the ids do), so the sequence is the one
    a Python pass over the same partitions stamps (`source_items(si, partition, 0,
    rows, offset=position)`).

    Args:
        source_index: Index of the input step in the flow.
        ids: The ids (an int64 Arrow array or anything `numpy.asarray` takes).

    Returns:
        One sequence per id.

    Example:
        >>> position_seqs(0, [(1 << 33) + 5]) == [source_seq(0, 1, 0, 5)]
        True
    """
    import numpy as np

    ids = np.asarray(ids, dtype=np.int64)
    return _packed(source_index, ids >> _POSITION_BITS, 0, ids & ((1 << _POSITION_BITS) - 1))


def source_seq(source_index: int, partition: int, activation: int, offset: int = 0) -> bytes:
    """Encode the sequence a source stamps on an item.

    Args:
        source_index: Index of the input step in the flow.
        partition: Index of the source partition.
        activation: Index of the item's source batch in its partition (or of the item,
            for sources stamped item by item).
        offset: Position of the item in its source batch.

    Returns:
        `SOURCE_LEN` (20) bytes.
    """
    return _PACK_SRC(activation, source_index, partition, offset)


def read_head(seq: bytes) -> tuple[int, int, int, int]:
    """Decode a sequence's source header.

    Args:
        seq: The sequence.

    Returns:
        `(source index, partition, activation, offset)`.

    Example:
        >>> read_head(source_seq(1, 2, 3, 4) + b"rest")
        (1, 2, 3, 4)
    """
    act, si, pi, off = _HEAD.unpack_from(seq)
    return si, pi, act, off


#: Exact types `marshal` round-trips without changing them. (It writes anything with the
#: buffer protocol, numpy arrays and scalars included, as plain bytes, and refuses
#: subclasses such as enums, so only these exact types take it; everything else is pickled.)
_FLAT = frozenset({int, float, str, bool, type(None), bytes})
_marshal_dumps = marshal.dumps
_marshal_loads = marshal.loads
_pickle_dumps = pickle.dumps
_pickle_loads = pickle.loads


def dumps(x: Any) -> bytes:
    """Encode an item for a Spark row.

    A value of an exact atomic type (`int`, `float`, `str`, `bool`, `None`, `bytes`) uses
    `marshal` (faster than pickle both ways); anything else uses pickle (protocol 5), then
    cloudpickle for what plain pickle refuses. A container goes to pickle without looking
    inside: proving every element marshal-safe costs more than pickle saves (a tuple of a
    `str` and an `int`: 0.72 s per 500k items checked then marshalled, 0.33 s pickled;
    0.50 s against 0.33 s both ways). A pickle always starts with byte 0x80 and a marshal
    never does, which is how `loads` tells them apart (and bytes an older version
    marshalled, containers included, still decode).

    Args:
        x: The item.

    Returns:
        The bytes.

    Example:
        >>> loads(dumps(("a", 1))), loads(dumps({"b": [1]})), loads(dumps(2))
        (('a', 1), {'b': [1]}, 2)
    """
    if type(x) in _FLAT:
        return _marshal_dumps(x)
    try:
        return _pickle_dumps(x, protocol=5)
    except Exception:  # noqa: BLE001
        return cloudpickle.dumps(x, protocol=5)


def dumps_all(xs: list[Any]) -> list[bytes]:
    """Encode a column of items, each as `dumps` does.

    The types are looked at once for the column, not per item: all atomic (`_FLAT`), marshal
    (about 2.5x faster for 1M ints, measured); none atomic, pickle in one comprehension (500k
    `(str, (int, int))` pairs: 0.30 s against 0.44 s item by item, measured), item by item
    only when plain pickle refuses one (cloudpickle then takes it).

    Args:
        xs: The items.

    Returns:
        One encoding per item, in order.

    Example:
        >>> [loads(b) for b in dumps_all([1, "a", (2, 3)])]
        [1, 'a', (2, 3)]
    """
    types = set(map(type, xs))
    if types <= _FLAT:
        return list(map(_marshal_dumps, xs))
    if types.isdisjoint(_FLAT):
        pickle_dumps = _pickle_dumps
        try:
            return [pickle_dumps(x, 5) for x in xs]
        except Exception:  # noqa: BLE001,S110
            pass  # one item needs cloudpickle: each item as `dumps` encodes it
    return list(map(dumps, xs))


def loads(b: bytes) -> Any:
    """Decode bytes made by `dumps`.

    Args:
        b: The bytes.

    Returns:
        The item.
    """
    return _pickle_loads(b) if b[0] == 0x80 else _marshal_loads(b)


def loads_all(bs: list[bytes]) -> list[Any]:
    """Decode a column of `dumps` bytes.

    Args:
        bs: The encoded items.

    Returns:
        The items, in order.
    """
    return _decode(bs, sum(1 for b in bs if b[0] == 0x80))


def _decode(values: list[bytes], pickled: int) -> list[Any]:
    """Decode `values`, `pickled` of which are pickles: one decoder for the column when it is all one kind."""
    if pickled == len(values):
        return list(map(_pickle_loads, values))
    if pickled == 0:
        return list(map(_marshal_loads, values))
    return list(map(loads, values))


def binary_buffers(array: Any) -> tuple[Any, Any]:
    """An Arrow `binary` or `large_binary` array's value offsets and bytes, as numpy arrays (no copy).

    Args:
        array: The array (not chunked), with at least one value.

    Returns:
        `(offsets, data)`: value `i` is `data[offsets[i]:offsets[i + 1]]`.
    """
    import numpy as np

    bufs = array.buffers()
    wide = str(array.type) == "large_binary"
    offsets = np.frombuffer(
        bufs[1], dtype=np.int64 if wide else np.int32, count=len(array) + 1, offset=array.offset * (8 if wide else 4)
    )
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data


def loads_arrow(column: Any) -> list[Any]:
    """Decode an Arrow binary column of `dumps` bytes (no nulls), telling pickles from marshals per column.

    The first byte of every value is read from the column's buffers at once, so a column of
    only pickles (containers) or only marshals (atomic values) decodes with one function and no
    per-item test.

    Args:
        column: A `binary` or `large_binary` Arrow array or chunked array.

    Returns:
        The items, in order.

    Example:
        >>> import pyarrow as pa
        >>> loads_arrow(pa.array([dumps(("a", 1)), dumps(2)], pa.binary()))
        [('a', 1), 2]
    """
    import numpy as np

    chunks = column.chunks if hasattr(column, "chunks") else [column]
    out: list[Any] = []
    for chunk in chunks:
        n = len(chunk)
        if not n:
            continue
        offsets, data = binary_buffers(chunk)
        out.extend(_decode(chunk.to_pylist(), int(np.count_nonzero(data[offsets[:-1]] == 0x80))))
    return out


def apply_pad(seq: bytes, pad: bytes) -> bytes:
    """A merge's pad applied to a sequence (what `flowspark.spark.io.columns.seq_column` does in Spark).

    Args:
        seq: The sequence.
        pad: Empty, or the upstream's 4-byte index (inserted after the source header)
            then zero padding (appended).

    Returns:
        The padded sequence.
    """
    if not pad:
        return seq
    return seq[:HEAD_LEN] + pad[:4] + seq[HEAD_LEN:] + pad[4:]


# --------------------------------------------------------------------------- errors
_MARK_RE = re.compile(r"FLOWSPARK_TASK_ERROR<<([A-Za-z0-9+/=]+)>>")
#: Starts the marker of a malformed input row: `FLOWSPARK_MALFORMED<<step|file|raw>>`, each field the
#: hex of its UTF-8 bytes (built by Spark SQL's `hex`: `flowspark.spark.io.inputs`).
MALFORMED_MARK = "FLOWSPARK_MALFORMED"
_MALFORMED_RE = re.compile(MALFORMED_MARK + r"<<([0-9A-Fa-f]*)\|([0-9A-Fa-f]*)\|([0-9A-Fa-f]*)>>")


#: Most bytes of the pickled user exception a task error marker carries (larger: type and message only).
CAUSE_LIMIT = 64 * 1024


def _pickled_cause(cause: Optional[BaseException]) -> Optional[bytes]:
    """The user's exception pickled for the driver, or `None` when it cannot travel.

    Plain pickle first (a class the worker imports by name is pickled by reference);
    then cloudpickle, for a class that travelled by value (one defined in the user's
    script or inside a function, and those of the user's own modules:
    `flowspark.spark.session.ship_user_modules`), which plain pickle refuses in a worker.
    cloudpickle gives such a class the id the driver gave it when it pickled the flow, so
    the driver unpickles the very class the user's `except` names; only the copy of
    cloudpickle that unpickled the class knows that id, and which one did depends on the
    path (pyspark's for the functions Spark runs, the `cloudpickle` package for a stage
    fused into flowspark's Python data source), so that copy goes first (`_cloudpicklers`).
    Skipped (`None`) when nothing pickles it, the bytes exceed `CAUSE_LIMIT`, or they do not
    unpickle here (e.g. an `__init__` that `args` cannot call again).
    """
    if cause is None:
        return None
    for pickler in (pickle, *_cloudpicklers(type(cause))):
        try:
            blob = pickler.dumps(cause, protocol=5)
        except Exception:  # noqa: BLE001,S112
            continue
        if len(blob) > CAUSE_LIMIT:
            return None
        try:
            pickle.loads(blob)
        except Exception:  # noqa: BLE001
            return None
        return blob
    return None


def _cloudpicklers(cls: type) -> list[Any]:
    """The copies of cloudpickle (pyspark's, the package), the one that unpickled `cls` by value first."""
    from pyspark import cloudpickle as spark_cloudpickle

    # cloudpickle's table of the classes it rebuilt by value, with the ids they came with (private; if a
    # version lacks it, pyspark's goes first and such a class may come back as an equal copy).
    return sorted([spark_cloudpickle, cloudpickle], key=lambda cp: not rebuilt_by_value(cp, cls))


def encode_task_error(fail: FlowsparkRuntimeError) -> str:
    """Encode a step failure into a marker that survives Spark's exception chain.

    The text before the marker is `str(fail)`, the one line the driver's error shows. The
    marker carries the error's parts and the user's exception pickled (see `CAUSE_LIMIT`),
    which `decode_task_error` sets as the rebuilt error's `__cause__`.

    Args:
        fail: The failure (`flowspark.errors.step_error`), its cause the user's exception.

    Returns:
        A message carrying the marker.
    """
    blob = _pickled_cause(fail.__cause__)
    exc_type = fail.exc_type if fail.exc_type is not None else type(fail).__name__
    exc_message = fail.exc_message if fail.exc_message is not None else str(fail)
    payload = pickle.dumps(
        (fail.step_id, fail.key, exc_type, exc_message, blob, isinstance(fail, TypeError), fail.item, str(fail))
    )
    return f"{fail} FLOWSPARK_TASK_ERROR<<{base64.b64encode(payload).decode()}>>"


def decode_task_error(text: str) -> Optional[FlowsparkRuntimeError]:
    """Find a marker made by `encode_task_error` in `text` and rebuild the error.

    Args:
        text: Any text (e.g. the message of a Py4J or PySpark exception).

    Returns:
        The error `step_error` made in the worker: a `FlowsparkRuntimeError` (a
        `FlowsparkRuntimeTypeError` for a `KeyRoutingError`) naming the step
        and key, with the original exception as `__cause__` (when it could be
        unpickled) and attributes `exc_type` and `exc_message` (the same text the
        in-memory executor gives, with what the worker's message adds to it, such as
        `flowspark.errors.resumed_error`'s advice), or `flowspark.errors.malformed_input_error`
        for a `MALFORMED_MARK`; `None` when `text` holds no marker.
    """
    m = _MARK_RE.search(text)
    if m is None:
        bad = _MALFORMED_RE.search(text)
        if bad is None:
            return None
        step_id, file, raw = (bytes.fromhex(h).decode("utf-8", "replace") for h in bad.groups())
        return malformed_input_error(step_id, file, raw)
    step_id, key, type_name, message, blob, type_error, item, said = pickle.loads(base64.b64decode(m.group(1)))
    cls = FlowsparkRuntimeTypeError if type_error else FlowsparkRuntimeError
    err = cls.describe(step_id, type_name, message, key, item)
    if said != str(err) and said.startswith(str(err)):  # the usual wording and more (`resumed_error`)
        err = cls(step_id, said, key, type_name, message, item)
    if blob is not None:
        try:
            err.__cause__ = _as_named_class(pickle.loads(blob))
        except Exception:  # noqa: BLE001,S110
            pass
    return err


def _as_named_class(exc: BaseException) -> BaseException:
    """`exc` as an instance of the class its module and name give here, when that is another class.

    A class that travelled by value comes back as that very class when the copy of
    cloudpickle that unpickled it in the worker also pickled the flow here (`_pickled_cause`).
    When the flow was pickled once more on the way (a stage fused into flowspark's Python
    data source: Spark re-pickles its reader in a planning worker), it comes back as an
    equal copy, which an `except` naming the user's class would miss; a class that has a
    module-level name (in the user's script, `__main__`, or the user's module) is found by
    that name and the exception rebuilt as it (same `args` and attributes). A class defined
    inside a function has no such name and stays the copy.
    """
    cls = type(exc)
    named: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        named = getattr(named, part, None)
    if named is cls or not isinstance(named, type) or not issubclass(named, BaseException):
        return exc
    if named.__name__ != cls.__name__:
        return exc
    try:
        again = named.__new__(named)
        again.__dict__.update(exc.__dict__)
        again.args = exc.args
    except Exception:  # noqa: BLE001
        return exc
    return again


def chunk_bounds(n: int, size: int, per_batch: int, cuts: list[int]) -> Iterator[tuple[int, int, int, int]]:
    """Split `n` driver items into chunks of at most `size`, none across a cut.

    Args:
        n: Number of items.
        size: Items per chunk.
        per_batch: Items per source batch (activation).
        cuts: Positions where a source batch starts early (`DriverItems.driver_cuts`).

    Yields:
        `(start, end, activation, offset)`: a chunk and where its first item sits
        (its activation and its offset in it; the worker stamps the rest with `per_batch`).
    """
    act0 = 0
    bounds = [0, *(c for c in cuts if 0 < c < n), n]
    for seg_start, seg_end in zip(bounds, bounds[1:], strict=False):
        for start in range(seg_start, seg_end, size):
            at = start - seg_start
            yield start, min(start + size, seg_end), act0 + at // per_batch, at % per_batch
        act0 += -(-(seg_end - seg_start) // per_batch)
