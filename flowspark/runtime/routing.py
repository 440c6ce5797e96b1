"""Which worker owns what, as Bytewax 0.21.1 assigns it among N workers.

Pure functions, shared by the in-memory executor's workers (`flowspark.runtime.workers`):

- **Keys of a stateful step**: Bytewax hashes the key with Rust's `DefaultHasher`
  (SipHash-1-3 with the keys 0, 0) over the key's UTF-8 bytes followed by `0xff`
  (how Rust hashes a `str`), and the worker is that 64-bit hash modulo the number of
  workers (`src/timely.rs`, `PartitionOp::partition`). `key_worker` computes the same.
- **Partitions of a `FixedPartitionedSource` / `FixedPartitionedSink`**: every worker
  lists the same partitions; Bytewax's `calc_primaries` then gives each partition, in
  sorted order, to the worker with the fewest so far (the lowest index on a tie):
  round robin over the sorted keys, `primaries`.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["key_worker", "primaries", "siphash13"]

_M = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M


def _sip_round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _M
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 of `data` (Rust's `DefaultHasher` uses it with the keys 0, 0).

    Args:
        data: The bytes to hash.
        k0: The first 64-bit key.
        k1: The second 64-bit key.

    Returns:
        The 64-bit hash.

    Example:
        >>> siphash13(b"")
        15130871412783076140
    """
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0 ^= m
    last = ((n & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v3 ^= last
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def key_worker(key: str, worker_count: int) -> int:
    """The worker of `worker_count` that owns `key` at a stateful step, as in Bytewax.

    Args:
        key: The state key.
        worker_count: Number of workers.

    Returns:
        The worker index.

    Example:
        >>> [key_worker(k, 2) for k in ("a", "b", "c")]
        [1, 0, 0]
    """
    if worker_count == 1:
        return 0
    return siphash13(key.encode("utf-8", "surrogatepass") + b"\xff") % worker_count


def primaries(parts: Iterable[str], worker_count: int) -> dict[str, int]:
    """The worker that builds and drives each partition of a fixed-partitioned source or sink.

    Args:
        parts: The partition keys (`list_parts()`).
        worker_count: Number of workers.

    Returns:
        Partition key -> worker index: round robin over the sorted keys.

    Example:
        >>> primaries(["c", "a", "b"], 2)
        {'a': 0, 'b': 1, 'c': 0}
    """
    return {key: i % worker_count for i, key in enumerate(sorted(parts))}
