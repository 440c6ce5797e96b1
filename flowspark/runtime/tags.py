"""Tags: the bytes that order a stateful step's emits as Bytewax would (the Spark runtimes' sequences).

`StepDriver.drive` (`flowspark.runtime.driver`) carries each value's *tag*, bytes that sort in processing order
(the Spark runtimes' sequences, see `flowspark.spark.worker.codec`). An emit gets its
value's tag with the key moved in right after the activation header (`regroup`: the
emits of one activation sort by key, as Bytewax groups an activation by key
before a stateful step) plus one 4-byte component (`idx`: its index among the
emits of that value); end-of-key emits get `eof_tag(level, key)` (sorting after every value
of the key, and by key: Bytewax calls `on_eof` in sorted key order) plus an index
from `EOF_BASE`. A runtime without tags passes empty bytes and ignores them; one that
reads no tags of the emits (a Spark stage writing a sink's rows) passes `tags=False`, and
the values' emits then carry empty tags (1M concatenated tags were a fifth of such a stage,
measured).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable
from typing import Any

__all__ = [
    "EOF_BASE",
    "EOF_HEADER",
    "HEAD_LEN",
    "SOURCE_LEN",
    "Emits",
    "eof_emits",
    "eof_tag",
    "idx",
    "key_tag",
    "regroup",
    "tag_emits",
]

#: First emit index used for emits at the end of a key (notifications fired after
#: the last value, then `on_eof`), so they sort after every other emit of the key.
EOF_BASE = 1 << 31
#: Activation field of end-of-key tags (plus the step's stateful level): above every
#: activation a source stamps.
EOF_HEADER = 0xFFFFFFFFFFFF0000
#: Length of the activation header of every Spark sequence (`>Q`: the source batch, see
#: `flowspark.spark.worker.codec`). A merge inserts its upstream's index, a stateful step its
#: key, right after it.
HEAD_LEN = 8
#: Length of a source's sequences: the activation, source index, partition and offset
#: (`>QIII`).
SOURCE_LEN = HEAD_LEN + 12

_PACK_I = struct.Struct(">I").pack
_IDX_CACHE = [_PACK_I(i) for i in range(4096)]
_PACK_Q = struct.Struct(">Q").pack

Emits = list[tuple[bytes, Any]]


def idx(i: int) -> bytes:
    """Encode one tag component.

    Args:
        i: The index (0 <= i < 2**32).

    Returns:
        Four big-endian bytes.
    """
    return _IDX_CACHE[i] if i < 4096 else _PACK_I(i)


def key_tag(key: str) -> bytes:
    """Encode a key as a tag component that sorts as the keys do and is prefix-free.

    UTF-8 with `0x00` escaped as `0x00 0xFF`, ended by `0x00 0x00`: tags compare as the
    keys do (code point order) and no key's component is a prefix of another's, so a
    comparison is decided inside it and never depends on what follows.

    Args:
        key: The key.

    Returns:
        The component.
    """
    return key.encode("utf-8", "surrogatepass").replace(b"\0", b"\0\xff") + b"\0\0"


def regroup(tag: bytes, ktag: bytes) -> bytes:
    """The tag of an emit's value with the key moved in after the activation header.

    Args:
        tag: A value's tag (empty for runtimes without tags).
        ktag: `key_tag(key)`.

    Returns:
        `header, key, rest`: an activation's values sort by key, each key's values in
        their former order. Empty for an empty tag.

    Example:
        >>> from flowspark.spark.worker.codec import source_seq
        >>> a1, b0 = source_seq(0, 0, 1, 0), source_seq(0, 1, 1, 0)  # partitions 0 and 1
        >>> regroup(b0, key_tag("a")) < regroup(a1, key_tag("b"))
        True
    """
    if not tag:
        return tag
    return tag[:HEAD_LEN] + ktag + tag[HEAD_LEN:]


def eof_tag(level: int, key: str) -> bytes:
    """The tag of a key's end-of-key emits.

    The activation `EOF_HEADER + level` (so a merge's upstream index, inserted after
    it, sorts above the key), then `key_tag(key)`. These tags sort after every other
    tag of the step's input, and by key.

    Args:
        level: Stateful steps on the longest path from a source to this step.
        key: The key.

    Returns:
        A tag above every tag the step's input can carry, ordered by key.
    """
    return _PACK_Q(EOF_HEADER + level) + key_tag(key)


def eof_emits(level: int, key: str, ws: Iterable[Any]) -> Emits:
    """A key's end-of-key emits `ws` with their tags: `eof_tag(level, key)`, then their index from `EOF_BASE`."""
    tag = eof_tag(level, key)
    return [(tag + idx(EOF_BASE + j), w) for j, w in enumerate(ws)]


def tag_emits(chunk: list[tuple[bytes, Any]], ws: list[Any], mid: bytes, tags: bool, out: Emits) -> None:
    """Append the emits `ws` of one batch of values `chunk` to `out`, tagged (see `StepDriver.drive`).

    Emit j gets the tag of value min(j, n-1) (with the key `mid` moved in, see `regroup`)
    plus j: strictly increasing, so order is kept. Without `tags`, empty tags.
    """
    nw, nc = len(ws), len(chunk)
    if not tags:
        out.extend(zip(itertools.repeat(b""), ws))
    elif not mid and nw <= nc and nw <= len(_IDX_CACHE):
        out.extend([(t + i, w) for (t, _), i, w in zip(chunk, _IDX_CACHE, ws, strict=False)])
    elif nw <= nc and nw <= len(_IDX_CACHE):
        cut = HEAD_LEN
        heads = [t for t, _ in chunk[:nw]]
        out.extend([(t[:cut] + mid + t[cut:] + i, w) for t, i, w in zip(heads, _IDX_CACHE, ws, strict=False)])
    else:
        last = nc - 1
        for j, w in enumerate(ws):
            out.append((regroup(chunk[j if j < last else last][0], mid) + idx(j), w))
