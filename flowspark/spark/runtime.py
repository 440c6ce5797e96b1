"""What runs inside Spark's Python workers: the stage evaluator and the per-key driver.

Everything here is plain Python over lists and bytes (pyarrow is only touched
in `run_stage_batches`, the adapter `mapInArrow` calls), so the same functions
serve the bounded batch runtime and a grouped-state streaming runtime.

Sequences. Every item travels with a *sequence*: bytes that sort (unsigned,
lexicographically) in the order the items must be processed. A source stamps
`>IIQ` (source index, source partition, position); every `flat_map_batch`
appends one `>I` component (the index of the output among the outputs of its
input item; the one-output-per-input mappers of `map`, `map_value`, `key_on` and
`key_rm` keep the input's sequence); a stateful step appends one component (the index of the emit
among the emits caused by one input value). Emits at the end of a key
(notifications due after the last value, then `on_eof`) get the header
`EOF_HEADER + level` (`level`: the number of stateful steps on the longest path
from a source to this step, so it is above every header the step's input can
carry), then the header and position of the value the key's logic was built on
(its partition field is dropped to keep the length), and indexes from
`EOF_BASE` on: they sort after every item emitted while input flowed, and keys
end in the order their logics were created, as in the in-memory executor. A merge inserts the upstream's index
right after the 16-byte source header and pads the sequence to the longest
upstream's length, so items derived from one source item come upstream by
upstream, as in the in-memory executor's passes. All sequences of one stream
have the same length, and sorting by sequence restores the order of the
in-memory executor for every item of one source partition and, within a key,
exactly.

The per-key driver (`drive_key`) runs a chain of stateful steps over one key's
values, given in sequence order. Time is a fixed logical `now` for the whole
call (see `docs/spark.md`): before each value, every notification that is due
(`notify_at() <= now`) fires (re-reading `notify_at()` after each fire; a time
equal to the one just fired does not fire again at the same point); at the end of the key's
values due notifications fire, then `on_eof` (when `eof=True`).
"""

from __future__ import annotations

import base64
import gc
import itertools
import marshal
import operator
import pickle
import re
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

import cloudpickle

from flowspark._time import use_clock
from flowspark.errors import FlowsparkRuntimeError, FlowsparkTypeError
from flowspark.operators import StatefulBatchLogic, _all_pairs, _check_bool, _wants_notify

__all__ = [
    "EOF_BASE",
    "KeyedStep",
    "Op",
    "StageSpec",
    "StepFailure",
    "decode_task_error",
    "dict_rows",
    "drive_key",
    "drive_sorted_rows",
    "encode_task_error",
    "not_dict_error",
    "run_stage_rows",
    "stage_streams",
]

#: First emit index used for emits at the end of a key (notifications fired after
#: the last value, then `on_eof`), so they sort after every other emit of the key.
EOF_BASE = 1 << 31
#: Source-index field of end-of-key emits (plus the step's stateful level).
EOF_HEADER = 0xFFFF0000
#: Length of the source header of every sequence (`>IIQ`).
HEAD_LEN = 16

_IDX_CACHE = [struct.pack(">I", i) for i in range(4096)]
_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_PACK_I = struct.Struct(">I").pack
_PACK_SRC = struct.Struct(">IIQ").pack
_KEY_CHUNK = 4096


def idx(i: int) -> bytes:
    """Encode one sequence component.

    Args:
        i: The index (0 <= i < 2**32).

    Returns:
        Four big-endian bytes.
    """
    return _IDX_CACHE[i] if i < 4096 else _PACK_I(i)


def source_items(source_index: int, partition: int, start: int, xs: list[Any]) -> list[tuple[bytes, Any]]:
    """Stamp consecutive items of one source partition with their sequences.

    Args:
        source_index: Index of the input step in the flow.
        partition: Index of the source partition.
        start: Position of the first item in its partition.
        xs: The items.

    Returns:
        `(sequence, item)` pairs; item `i` gets `source_seq(source_index, partition, start + i)`.
    """
    n = len(xs)
    if n < 16:
        return [(_PACK_SRC(source_index, partition, start + i), x) for i, x in enumerate(xs)]
    import numpy as np

    arr = np.empty(n, dtype=_SEQ_DTYPE)
    arr["s"] = source_index
    arr["p"] = partition
    arr["q"] = np.arange(start, start + n, dtype=np.uint64)
    buf = arr.tobytes()
    return list(zip([buf[i : i + HEAD_LEN] for i in range(0, n * HEAD_LEN, HEAD_LEN)], xs, strict=True))


_SEQ_DTYPE = [("s", ">u4"), ("p", ">u4"), ("q", ">u8")]


def source_seq(source_index: int, partition: int, position: int) -> bytes:
    """Encode the sequence a source stamps on an item.

    Args:
        source_index: Index of the input step in the flow.
        partition: Index of the source partition.
        position: Position of the item in its partition.

    Returns:
        16 bytes.
    """
    return _PACK_SRC(source_index, partition, position)


#: Exact types `marshal` round-trips without changing them. (It writes anything with the
#: buffer protocol, numpy arrays and scalars included, as plain bytes, and refuses
#: subclasses such as namedtuples and enums, so only these, at most one container deep,
#: take the fast path; everything else is pickled.)
_FLAT = frozenset({int, float, str, bool, type(None), bytes})
_marshal_dumps = marshal.dumps
_marshal_loads = marshal.loads
_pickle_loads = pickle.loads


def _is_flat(x: Any) -> bool:
    t = type(x)
    if t in _FLAT:
        return True
    if t is tuple or t is list:
        return all(type(e) in _FLAT for e in x)
    if t is dict:
        return all(type(k) in _FLAT and type(v) in _FLAT for k, v in x.items())
    return False


def dumps(x: Any) -> bytes:
    """Encode an item for a Spark row.

    Flat values (exact `int`, `float`, `str`, `bool`, `None`, `bytes`, or a tuple, list
    or dict of them) use `marshal` (about twice as fast as pickle both ways); anything
    else uses pickle (protocol 5), then cloudpickle for what plain pickle refuses. A
    pickle always starts with byte 0x80 and a marshal never does, which is how `loads`
    tells them apart.

    Args:
        x: The item.

    Returns:
        The bytes.

    Example:
        >>> loads(dumps(("a", 1))), loads(dumps({"b": [1]}))
        (('a', 1), {'b': [1]})
    """
    if _is_flat(x):
        return _marshal_dumps(x)
    try:
        return pickle.dumps(x, protocol=5)
    except Exception:  # noqa: BLE001
        return cloudpickle.dumps(x, protocol=5)


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
    if any(b[0] == 0x80 for b in bs):
        return list(map(loads, bs))
    return list(map(_marshal_loads, bs))


# --------------------------------------------------------------------------- errors
class StepFailure(Exception):
    """A user callable (or the data it received) failed in step `step_id`."""

    def __init__(self, step_id: str, error: BaseException) -> None:
        """Wrap `error` raised in `step_id`."""
        super().__init__(f"error in step {step_id!r}: {type(error).__name__}: {error}")
        self.step_id = step_id
        self.error = error


_MARK_RE = re.compile(r"FLOWSPARK_TASK_ERROR<<([A-Za-z0-9+/=]+)>>")


def encode_task_error(fail: StepFailure) -> str:
    """Encode a step failure into a marker that survives Spark's exception chain.

    Args:
        fail: The failure.

    Returns:
        A message carrying the marker.
    """
    err = fail.error
    try:
        blob = pickle.dumps(err)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001
        blob = None
    payload = pickle.dumps((fail.step_id, type(err).__name__, str(err), blob))
    return f"{fail} FLOWSPARK_TASK_ERROR<<{base64.b64encode(payload).decode()}>>"


def decode_task_error(text: str) -> Optional[FlowsparkRuntimeError]:
    """Find a marker made by `encode_task_error` in `text` and rebuild the error.

    Args:
        text: Any text (e.g. the message of a Py4J or PySpark exception).

    Returns:
        A `FlowsparkRuntimeError` naming the step, with the original exception as
        `__cause__` (when it could be unpickled) and attributes `exc_type` and
        `exc_message`; `None` when `text` holds no marker.
    """
    m = _MARK_RE.search(text)
    if m is None:
        return None
    step_id, type_name, message, blob = pickle.loads(base64.b64decode(m.group(1)))
    err = FlowsparkRuntimeError(step_id, f"error in step {step_id!r}: {type_name}: {message}")
    err.exc_type = type_name  # type: ignore[attr-defined]
    err.exc_message = message  # type: ignore[attr-defined]
    if blob is not None:
        try:
            err.__cause__ = pickle.loads(blob)
        except Exception:  # noqa: BLE001,S110
            pass
    return err


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Op:
    """One stateless core step inside a fused stage.

    `kind` is `map` (flat_map_batch), `inspect` (pass through and copy to
    `side`), `pass` (redistribute), `branch` or `merge`. `ups`/`downs` are
    stream ids; for `merge`, `pads[i]` is the upstream's 4-byte index (inserted
    after the source header) then zero padding (appended).
    """

    kind: str
    step_id: str
    ups: tuple[str, ...]
    downs: tuple[str, ...]
    fn: Optional[Callable[..., Any]] = None
    pads: tuple[bytes, ...] = ()
    one_to_one: bool = False


#: flowspark's own `flat_map_batch` mappers that return exactly one output per input
#: (`map`, `map_value`, `key_on`, `key_rm`): called once per batch, not once per item.
_ONE_TO_ONE = frozenset(f"{name}.<locals>.shim_mapper" for name in ("map", "map_value", "key_on", "key_rm"))


def is_one_to_one(fn: Any) -> bool:
    """Whether `fn` is one of flowspark's one-output-per-input mappers.

    Args:
        fn: A `flat_map_batch` mapper.

    Returns:
        True for the mappers of `map`, `map_value`, `key_on`, `key_rm`.
    """
    return getattr(fn, "__module__", None) == "flowspark.operators" and getattr(fn, "__qualname__", "") in _ONE_TO_ONE


@dataclass(frozen=True)
class KeyedStep:
    """One stateful step of a fused keyed chain.

    `level`: the number of stateful steps on the longest path from a source to
    this step (itself included); it orders end-of-key emits after their inputs.
    """

    step_id: str
    builder: Callable[[Any], Any]
    level: int = 1


def _eof_seq(level: int, built: bytes) -> bytes:
    return _PACK_I(EOF_HEADER + level) + built[:4] + built[8:]


@dataclass(frozen=True)
class Port:
    """A stream that leaves its stage (to another stage, a sink or the driver).

    `key_for` names the stateful step whose input this stream is: the stage
    then checks items are `(str, value)` and fills the key column. `value_only`:
    every reader of the port is a keyed stage, so the `v` column holds only the
    value (the key is in `k`); otherwise it holds the whole `(key, value)` item.
    """

    stream: str
    key_for: Optional[str] = None
    value_only: bool = False


@dataclass(frozen=True)
class StageSpec:
    """What one Python pass of a stage does (shipped to the workers, pickled once per stage).

    `source`: how input rows become items: `rows` (k, seq, v rows of a previous
    stage), `chunks` (pickled lists of items sent from the driver), `parts`
    (source partitions to build and read), `native` (rows of a Spark DataFrame,
    one dict per row). `entry` is the stream the input items (or, when `chain` is
    not empty, the chain's emits) belong to. `input_value_only`: for a keyed stage,
    whether its input rows carry only the value in `v` (see `Port.value_only`).
    """

    stage_id: int
    source: str
    entry: str
    chain: tuple[KeyedStep, ...] = ()
    ops: tuple[Op, ...] = ()
    ports: tuple[Port, ...] = ()
    source_step: str = ""
    source_index: int = 0
    input_value_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- keyed driver


def _build(step: KeyedStep, key: str, state: Any) -> Any:
    logic = step.builder(state)
    if not isinstance(logic, StatefulBatchLogic):
        msg = (
            f"step {step.step_id!r}: builder must return a StatefulBatchLogic (or, for "
            f"`op.stateful`, a StatefulLogic); returned {logic!r} for key {key!r}"
        )
        raise FlowsparkTypeError(msg)
    return logic


def _emits(step_id: str, key: str, res: Any, where: str) -> tuple[list[Any], bool]:
    if type(res) is not tuple or len(res) != 2:
        msg = (
            f"step {step_id!r}: {where} must return a 2-tuple (emits, discard) such as "
            f"`([x], StatefulLogic.RETAIN)`; returned {res!r} for key {key!r}"
        )
        raise FlowsparkTypeError(msg)
    emits, discard = res
    return (emits if type(emits) is list else list(emits)), bool(discard)


def _due(step_id: str, key: str, logic: Any, now: datetime, last: Optional[datetime]) -> Optional[datetime]:
    at = logic.notify_at()
    if at is None:
        return None
    if not isinstance(at, datetime) or at.tzinfo is None:
        msg = (
            f"step {step_id!r}: notify_at() must return an aware datetime "
            f"(e.g. datetime.now(timezone.utc)) or None; returned {at!r} for key {key!r}"
        )
        raise FlowsparkTypeError(msg)
    if at <= now and at != last:
        return at
    return None


def _fire_due(
    sid: str, key: str, logic: Any, now: datetime, seq: bytes, n: int, out: list[tuple[bytes, Any]]
) -> tuple[Any, int]:
    """Fire the key's notifications due at `now` (re-checking after each); emits get `seq + idx(n...)`.

    Returns:
        The logic (`None` if a notification discarded it) and the next emit index.
    """
    last_fired: Optional[datetime] = None
    while logic is not None:
        at = _due(sid, key, logic, now, last_fired)
        if at is None:
            break
        last_fired = at
        ws, discard = _emits(sid, key, logic.on_notify(), "on_notify()")
        for w in ws:
            out.append((seq + idx(n), w))
            n += 1
        if discard:
            logic = None
    return logic, n


def _run_step(
    step: KeyedStep,
    key: str,
    items: list[tuple[bytes, Any]],
    logic: Any,
    now: datetime,
    eof: bool,
) -> tuple[list[tuple[bytes, Any]], Any]:
    """Run one stateful step over one key's values; return (emits with sequences, logic or None)."""
    sid = step.step_id
    out: list[tuple[bytes, Any]] = []
    # End-of-key emits sort by the sequence of the value the key's live logic was built
    # on: the in-memory executor ends keys in the order their logics were created.
    built = items[0][0] if items else b"\0" * HEAD_LEN
    if items and logic is None:
        logic = _build(step, key, None)
    if logic is not None and not _wants_notify(logic):
        # No timers: hand the values over in large batches. Emit j of a batch gets the
        # sequence of value min(j, n-1) plus j: strictly increasing, so order is kept.
        for start in range(0, len(items), _KEY_CHUNK):
            chunk = items[start : start + _KEY_CHUNK]
            if logic is None:
                logic = _build(step, key, None)
                built = chunk[0][0]
            res = logic.on_batch([v for _, v in chunk])
            if type(res) is tuple and len(res) == 2 and type(res[0]) is list:
                ws, discard = res
            else:
                ws, discard = _emits(sid, key, res, "on_batch()/on_item()")
            if ws:
                nw, nc = len(ws), len(chunk)
                if nw <= nc and nw <= len(_IDX_CACHE):
                    ic = _IDX_CACHE
                    out.extend([(chunk[j][0] + ic[j], w) for j, w in enumerate(ws)])
                else:
                    last = nc - 1
                    for j, w in enumerate(ws):
                        out.append((chunk[j if j < last else last][0] + idx(j), w))
            if discard:
                logic = None
        last_seq = _eof_seq(step.level, built)
        if eof and logic is not None:
            ws, discard = _emits(sid, key, logic.on_eof(), "on_eof()")
            for j, w in enumerate(ws):
                out.append((last_seq + idx(EOF_BASE + j), w))
            if discard:
                logic = None
        return out, logic
    for seq, v in items:
        n = 0
        if logic is None:
            logic = _build(step, key, None)
            built = seq
        logic, n = _fire_due(sid, key, logic, now, seq, n, out)
        if logic is None:
            logic = _build(step, key, None)
            built = seq
        ws, discard = _emits(sid, key, logic.on_batch([v]), "on_batch()/on_item()")
        for w in ws:
            out.append((seq + idx(n), w))
            n += 1
        if discard:
            logic = None
    if eof and logic is not None:
        last_seq = _eof_seq(step.level, built)
        n = EOF_BASE
        logic, n = _fire_due(sid, key, logic, now, last_seq, n, out)
        if logic is not None:
            ws, discard = _emits(sid, key, logic.on_eof(), "on_eof()")
            for w in ws:
                out.append((last_seq + idx(n), w))
                n += 1
            if discard:
                logic = None
    return out, logic


def drive_key(
    key: str,
    items: list[tuple[bytes, Any]],
    steps: tuple[KeyedStep, ...],
    logics: Optional[list[Any]] = None,
    *,
    now: datetime,
    eof: bool = True,
) -> tuple[list[tuple[bytes, Any]], list[Any]]:
    """Run a fused chain of stateful steps over the values of one key.

    Time does not pass during the call (`now` is fixed), so running the chain
    step after step over the whole key is the same as interleaving the steps
    value by value.

    Args:
        key: The key.
        items: `(sequence, value)` pairs of the key, in sequence order.
        steps: The chain (each step consumes the previous one's emits).
        logics: The live logic of each step for this key (`None` entries are built
            fresh on the first value); default all `None`. A streaming runtime passes
            logics rebuilt from state and keeps the returned ones.
        now: The logical time notifications are compared with.
        eof: Whether the input of this key ends here (fire due notifications and
            `on_eof` after the last value).

    Returns:
        `(emits, logics)`: the last step's emits as `(sequence, value)` pairs in
        order (values only; the key is implied), and each step's logic after the
        call (`None` where it was discarded).

    Raises:
        StepFailure: A user callable failed or returned something malformed.
    """
    cur = logics if logics is not None else [None] * len(steps)
    new: list[Any] = []
    for i, step in enumerate(steps):
        try:
            items, logic = _run_step(step, key, items, cur[i], now, eof)
        except StepFailure:
            raise
        except Exception as e:
            raise StepFailure(step.step_id, e) from e
        new.append(logic)
    return items, new


def drive_sorted_rows(
    rows: Iterable[tuple[str, bytes, Any]],
    steps: tuple[KeyedStep, ...],
    *,
    now: datetime,
) -> Iterator[tuple[str, list[tuple[bytes, Any]]]]:
    """Drive a chain over rows sorted by (key, sequence): one `drive_key` call per key.

    Args:
        rows: `(key, sequence, value)` triples sorted by key then sequence.
        steps: The fused chain.
        now: The logical time.

    Yields:
        `(key, emits)` for each key, in the order of the rows.
    """
    for key, grp in itertools.groupby(rows, key=_first):
        yield key, drive_key(key, [(s, v) for _k, s, v in grp], steps, now=now)[0]


def _key_runs(batches: Iterator[Any], value_only: bool) -> Iterator[tuple[str, list[tuple[bytes, Any]]]]:
    """Group Arrow batches of `(k, seq, v)` rows sorted by (k, seq) into `(key, [(seq, value)])` runs.

    A key's rows may span batches; each key is yielded once, with all its rows.
    """
    import pyarrow.compute as pc

    cur_key: Optional[str] = None
    buf: list[tuple[bytes, Any]] = []
    for b in batches:
        if not b.num_rows:
            continue
        ss = b.column(1).to_pylist()
        vs = loads_all(b.column(2).to_pylist())
        if not value_only:
            vs = list(map(_second, vs))
        runs = pc.run_end_encode(b.column(0))
        start = 0
        for key, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
            if key != cur_key:
                if cur_key is not None:
                    yield cur_key, buf
                cur_key = key
                buf = list(zip(ss[start:end], vs[start:end], strict=True))
            else:
                buf.extend(zip(ss[start:end], vs[start:end], strict=True))
            start = end
    if cur_key is not None:
        yield cur_key, buf


# --------------------------------------------------------------------------- stateless ops
def _bad_key_item(step_id: str, kv: Any) -> FlowsparkTypeError:
    if isinstance(kv, tuple) and len(kv) == 2:
        msg = (
            f"step {step_id!r}: keys must be str; received key {kv[0]!r} of type "
            f"{type(kv[0]).__name__} in item {kv!r}; convert it in `op.key_on` (e.g. `str(...)`)"
        )
    else:
        msg = (
            f"step {step_id!r} requires `(key, value)` 2-tuple items; received {kv!r} "
            f"of type {type(kv).__name__}; use `op.key_on` to make a keyed stream"
        )
    return FlowsparkTypeError(msg)


def _apply_ops(ops: tuple[Op, ...], streams: dict[str, list[tuple[bytes, Any]]]) -> None:
    """Run the stateless ops over `streams` (stream id -> [(seq, item)]), in place."""
    empty: list[tuple[bytes, Any]] = []
    for op in ops:
        kind = op.kind
        if kind == "merge":
            out: list[tuple[bytes, Any]] = []
            for up, pad in zip(op.ups, op.pads, strict=True):
                tag, zeros = pad[:4], pad[4:]
                out.extend([(s[:HEAD_LEN] + tag + s[HEAD_LEN:] + zeros, x) for s, x in streams.get(up, empty)])
            streams[op.downs[0]] = out
            continue
        ins = streams.get(op.ups[0], empty)
        if kind == "map":
            fn = op.fn
            assert fn is not None
            out = []
            if op.one_to_one and ins:
                try:
                    res = fn([x for _, x in ins])
                except Exception as e:
                    raise StepFailure(op.step_id, e) from e
                if type(res) is list and len(res) == len(ins):
                    # One output per input: it keeps its input's sequence (the compiler
                    # adds no component for these steps).
                    streams[op.downs[0]] = list(zip([sx[0] for sx in ins], res, strict=True))
                    continue
                msg = f"step {op.step_id!r}: a one-to-one mapper returned {len(res)} items for {len(ins)} inputs"
                raise StepFailure(op.step_id, FlowsparkTypeError(msg))
            try:
                for s, x in ins:
                    res = fn([x])
                    if type(res) is list and len(res) == 1:
                        out.append((s + _IDX_CACHE[0], res[0]))
                        continue
                    try:
                        it = iter(res)
                    except TypeError:
                        msg = (
                            f"step {op.step_id!r}: the mapper must return an iterable; "
                            f"returned {res!r} of type {type(res).__name__}"
                        )
                        raise FlowsparkTypeError(msg) from None
                    for j, y in enumerate(it):
                        out.append((s + idx(j), y))
            except Exception as e:
                raise StepFailure(op.step_id, e) from e
            streams[op.downs[0]] = out
        elif kind == "branch":
            pred = op.fn
            assert pred is not None
            trues: list[tuple[bytes, Any]] = []
            falses: list[tuple[bytes, Any]] = []
            try:
                for sx in ins:
                    r = pred(sx[1])
                    if r is True:
                        trues.append(sx)
                    elif r is False:
                        falses.append(sx)
                    else:
                        _check_bool(op.step_id, "branch predicate", sx[1], r)
            except Exception as e:
                raise StepFailure(op.step_id, e) from e
            streams[op.downs[0]] = trues
            streams[op.downs[1]] = falses
        else:  # inspect (downs: passthrough, side copy) and pass (redistribute)
            for d in op.downs:
                streams[d] = ins


def _first_bad_key_item(step_id: str, xs: list[Any]) -> FlowsparkTypeError:
    for x in xs:
        if type(x) is not tuple or len(x) != 2 or type(x[0]) is not str:
            return _bad_key_item(step_id, x)
    raise AssertionError(step_id)


def _port_rows(
    spec: StageSpec,
    streams: dict[str, list[tuple[bytes, Any]]],
    out_p: list[int],
    out_k: list[Optional[str]],
    out_s: list[bytes],
    out_v: list[bytes],
) -> None:
    for p, port in enumerate(spec.ports):
        items = streams.get(port.stream)
        if not items:
            continue
        n = len(items)
        xs = list(map(_second, items))
        out_p.extend([p] * n)
        out_s.extend(map(_first, items))
        if port.key_for is not None:
            # Checked column-wise: every item a 2-tuple whose key is a str.
            if not _all_pairs(xs):
                raise StepFailure(port.key_for, _first_bad_key_item(port.key_for, xs))
            ks = list(map(_first, xs))
            if set(map(type, ks)) != {str}:
                raise StepFailure(port.key_for, _first_bad_key_item(port.key_for, xs))
            out_k.extend(ks)
            out_v.extend(map(dumps, map(_second, xs) if port.value_only else xs))
        else:
            out_k.extend([None] * n)
            out_v.extend(map(dumps, xs))


def not_dict_error(step_id: str, x: Any) -> FlowsparkTypeError:
    """The error for an item a `SparkSink` cannot write (not a dict).

    Args:
        step_id: The sink's step id.
        x: The item.

    Returns:
        The error.
    """
    msg = (
        f"step {step_id!r}: SparkSink writes dict items (one row each); received {x!r} of type "
        f"{type(x).__name__}; map items to dicts before the output"
    )
    return FlowsparkTypeError(msg)


def dict_rows(step_id: str, items: list[Any], arrow_schema: Any) -> Any:
    """The rows a `SparkSink` writes: dict items as one Arrow record batch of `arrow_schema`.

    Args:
        step_id: The sink's step id.
        items: The items (dicts).
        arrow_schema: The sink's schema as an Arrow schema.

    Returns:
        A `pyarrow.RecordBatch`.

    Raises:
        StepFailure: An item is not a dict or does not fit the schema (names the sink).
    """
    import pyarrow as pa

    bad = next((x for x in items if not isinstance(x, dict)), None)
    if bad is not None:
        raise StepFailure(step_id, not_dict_error(step_id, bad))
    try:
        return pa.RecordBatch.from_pylist(items, schema=arrow_schema)
    except Exception as e:
        raise StepFailure(step_id, e) from e


def run_stage_rows(
    spec: StageSpec,
    items: list[tuple[bytes, Any]],
) -> tuple[list[int], list[Optional[str]], list[bytes], list[bytes]]:
    """Push items of the stage's entry stream through its stateless ops.

    Args:
        spec: The stage.
        items: `(sequence, item)` pairs of the entry stream.

    Returns:
        Column lists `(port, key, sequence, pickled item)` of the rows leaving the stage.

    Raises:
        StepFailure: A user callable failed.
    """
    cols: tuple[list[int], list[Optional[str]], list[bytes], list[bytes]] = ([], [], [], [])
    _port_rows(spec, stage_streams(spec, items), *cols)
    return cols


def stage_streams(spec: StageSpec, items: list[tuple[bytes, Any]]) -> dict[str, list[tuple[bytes, Any]]]:
    """Push items of the stage's entry stream through its stateless ops.

    Args:
        spec: The stage.
        items: `(sequence, item)` pairs of the entry stream.

    Returns:
        Every stream of the stage: stream id -> `(sequence, item)` pairs.

    Raises:
        StepFailure: A user callable failed.
    """
    streams: dict[str, list[tuple[bytes, Any]]] = {spec.entry: items}
    _apply_ops(spec.ops, streams)
    return streams


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a task.

    A stage allocates millions of small tuples; inside a Spark Python worker (many
    live objects) the collector's full scans made a source stage ~5x slower (9 s
    instead of 1.6 s for 1M rows, measured). Reference counting still frees every
    acyclic object; cycles wait for the collector to resume after the task.

    Yields:
        Nothing.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# --------------------------------------------------------------------------- sources inside tasks
def _read_partition(step_id: str, part: Any) -> Iterator[list[Any]]:
    """Read a built source partition to its end, batch by batch."""
    import time

    from flowspark._time import utc_now
    from flowspark.inputs import AbortExecution

    try:
        while True:
            awake = part.next_awake() if hasattr(part, "next_awake") else None
            if awake is not None:
                wait = (awake - utc_now()).total_seconds()
                if wait > 0:
                    time.sleep(min(wait, 1.0))
                    continue
            try:
                batch = part.next_batch()
            except StopIteration:
                return
            except AbortExecution:
                msg = "the source aborted the execution (AbortExecution); a Spark batch job cannot stop half-way"
                raise RuntimeError(msg) from None
            yield list(batch)
    except StepFailure:
        raise
    except Exception as e:
        raise StepFailure(step_id, e) from e
    finally:
        try:
            part.close()
        except Exception:  # noqa: BLE001,S110
            pass


def _entry_items_from_source(spec: StageSpec, batch: Any, partition_id: int) -> Iterator[list[tuple[bytes, Any]]]:
    """Turn one Arrow batch of the stage's input into lists of (seq, item) of the entry stream."""
    src = spec.source
    if src == "chunks":
        seqs = batch.column(1).to_pylist()
        blobs = batch.column(2).to_pylist()
        for head, blob in zip(seqs, blobs, strict=True):
            si, pi, pos = struct.unpack(">IIQ", head)
            yield source_items(si, pi, pos, loads(blob))
    elif src == "parts":
        seqs = batch.column(1).to_pylist()
        blobs = batch.column(2).to_pylist()
        for head, blob in zip(seqs, blobs, strict=True):
            si, pi, _ = struct.unpack(">IIQ", head)
            source, part_key, worker_count = loads(blob)
            try:
                if part_key is None:
                    part = source.build(spec.source_step, pi, worker_count)
                else:
                    part = source.build_part(spec.source_step, part_key, None)
            except Exception as e:
                raise StepFailure(spec.source_step, e) from e
            pos = 0
            for xs in _read_partition(spec.source_step, part):
                yield source_items(si, pi, pos, xs)
                pos += len(xs)
    else:
        raise AssertionError(src)


def stage_function(
    spec: StageSpec, now: datetime, out_batch_rows: int = 8192
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Build the function `mapInArrow` calls for one stage.

    Args:
        spec: The stage.
        now: The logical time of the run (installed as the clock of `flowspark._time`).
        out_batch_rows: Rows per output Arrow batch.

    Returns:
        A function from an iterator of `pyarrow.RecordBatch` to one of output batches
        with columns `p` (int32), `k` (string), `seq` (binary), `v` (binary).
    """

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        try:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            partition_id = ctx.partitionId() if ctx is not None else 0
        except Exception:  # noqa: BLE001
            partition_id = 0
        schema = pa.schema([("p", pa.int32()), ("k", pa.string()), ("seq", pa.binary()), ("v", pa.binary())])

        def mk(cols: tuple[list[int], list[Optional[str]], list[bytes], list[bytes]]) -> Any:
            return pa.RecordBatch.from_arrays(
                [
                    pa.array(cols[0], pa.int32()),
                    pa.array(cols[1], pa.string()),
                    pa.array(cols[2], pa.binary()),
                    pa.array(cols[3], pa.binary()),
                ],
                schema=schema,
            )

        try:
            with use_clock(lambda: now), no_gc():
                for cols in _stage_columns(spec, batches, now, partition_id, out_batch_rows):
                    if cols[0]:
                        yield mk(cols)
        except StepFailure as f:
            raise RuntimeError(encode_task_error(f)) from None

    return fn


def _stage_columns(
    spec: StageSpec, batches: Iterator[Any], now: datetime, partition_id: int, out_rows: int
) -> Iterator[tuple[list[int], list[Optional[str]], list[bytes], list[bytes]]]:
    src = spec.source
    if spec.chain:
        # Keyed stage: rows arrive sorted by (k, seq).
        pending: list[tuple[bytes, Any]] = []
        for key, items in _key_runs(batches, spec.input_value_only):
            emits = drive_key(key, items, spec.chain, now=now)[0]
            if emits:
                pending.extend([(s, (key, w)) for s, w in emits])
            if len(pending) >= out_rows:
                yield run_stage_rows(spec, pending)
                pending = []
        if pending:
            yield run_stage_rows(spec, pending)
        return
    if src == "rows":
        for b in batches:
            ss = b.column(1).to_pylist()
            yield run_stage_rows(spec, list(zip(ss, loads_all(b.column(2).to_pylist()), strict=True)))
        return
    if src == "native":
        si = spec.source_index
        pos = 0
        for b in batches:
            try:
                xs = b.to_pylist()
            except Exception as e:
                raise StepFailure(spec.source_step, e) from e
            items = source_items(si, partition_id, pos, xs)
            pos += len(xs)
            yield run_stage_rows(spec, items)
        return
    for b in batches:
        for items in _entry_items_from_source(spec, b, partition_id):
            for start in range(0, len(items), out_rows):
                yield run_stage_rows(spec, items[start : start + out_rows])
