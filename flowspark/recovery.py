"""Recovery for the in-memory executor: epoch snapshots in SQLite partitions.

Create the store once with `init_db_dir(db_dir, count)` (or
`python -m flowspark.recovery DB_DIR COUNT`), then pass
`RecoveryConfig(db_dir)` to `run_main`. At every epoch boundary the executor
writes the state of every key touched in the epoch, every source partition's
position and every sink partition's state, then commits the epoch. A later run
with the same store resumes from the last epoch committed in every partition:
after an EOF it continues the input with state restored; after an abort or
crash it replays the input since the last snapshot (output of that stretch may
be repeated). Snapshots are kept per step and key (or partition), not per worker,
so a run may resume a store written with another number of workers
(`cluster_main(..., worker_count_per_proc=N)`): each worker takes the keys and
partitions it owns now, as Bytewax rescales.

Garbage collection, as in Bytewax: once an epoch is committed in every
partition, each partition deletes the snapshots that epoch `E - k` no longer
needs, where `k` is `backup_interval / epoch_interval` rounded up (0 by
default). A store can therefore resume from any epoch of the last `k`: restoring
partitions from backups taken up to `backup_interval` apart works, and the run
resumes from the oldest restored epoch. A partition older than that cannot be
resumed from without data loss (the others deleted what its epoch needs):
opening the store raises `InconsistentPartitionsError`.
"""

from __future__ import annotations

import argparse
import math
import pickle
import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional
from zlib import adler32

from flowspark.errors import InconsistentPartitionsError, MissingPartitionsError, NoPartitionsError

__all__ = [
    "InconsistentPartitionsError",
    "MissingPartitionsError",
    "NoPartitionsError",
    "RecoveryConfig",
    "init_db_dir",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS parts (part_index INTEGER PRIMARY KEY, part_count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS snaps (
    step_id TEXT NOT NULL,
    state_key TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    ser_change BLOB,
    PRIMARY KEY (step_id, state_key, epoch)
);
CREATE TABLE IF NOT EXISTS commits (epoch INTEGER PRIMARY KEY);
"""
_GC_TABLE = "CREATE TABLE IF NOT EXISTS gc (part_index INTEGER PRIMARY KEY, gc_epoch INTEGER NOT NULL)"
# `gc`: this partition holds the state as of `gc_epoch` and later epochs only (older
# versions it no longer needed are deleted). Absent (a store written before it existed): 0.


@dataclass(frozen=True)
class RecoveryConfig:
    """Where and how to keep recovery snapshots.

    Args:
        db_dir: Directory created by `init_db_dir`.
        backup_interval: Keep the snapshots an epoch needs for this long after a newer
            epoch superseded it (as in Bytewax: counted in epochs, `backup_interval /
            epoch_interval` rounded up), so that partitions restored from backups taken
            up to this far apart can still be resumed from. Set it to how often the
            partitions are backed up. Default (`None`): zero, nothing older than the
            last committed epoch is kept.

    Raises:
        TypeError: `backup_interval` is not a `timedelta`.
        ValueError: `backup_interval` is negative.
    """

    db_dir: Path
    backup_interval: Optional[timedelta] = None

    def __post_init__(self) -> None:
        """Check `backup_interval`."""
        bi = self.backup_interval
        if bi is not None and not isinstance(bi, timedelta):
            msg = (
                f"RecoveryConfig: backup interval must be a `datetime.timedelta`; received {bi!r} "
                f"of type {type(bi).__name__}"
            )
            raise TypeError(msg)
        if bi is not None and bi < timedelta(0):
            msg = f"RecoveryConfig: backup interval must not be negative; received {bi!r}"
            raise ValueError(msg)


def epochs_per(epoch_interval: timedelta, backup_interval: Optional[timedelta]) -> Optional[int]:
    """How many epochs `backup_interval` lasts (rounded up), as Bytewax counts it.

    Args:
        epoch_interval: The run's epoch length.
        backup_interval: `RecoveryConfig.backup_interval`.

    Returns:
        The number of superseded epochs to keep; `None`: keep all (a non-zero backup
        interval with a zero epoch interval).

    Example:
        >>> epochs_per(timedelta(seconds=5), timedelta(seconds=12))
        3
        >>> epochs_per(timedelta(seconds=5), None)
        0
    """
    if not backup_interval:
        return 0
    if not epoch_interval:
        return None
    us = timedelta(microseconds=1)
    return math.ceil((backup_interval // us) / (epoch_interval // us))


def init_db_dir(db_dir: Path, count: int) -> None:
    """Create a recovery store of `count` SQLite partitions in `db_dir`.

    Args:
        db_dir: Directory (created if missing).
        count: Number of partitions (>= 1).

    Raises:
        ValueError: `count` < 1.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> init_db_dir(d, 2)
        >>> sorted(p.name for p in d.iterdir())
        ['part-0.sqlite3', 'part-1.sqlite3']
    """
    if not isinstance(count, int) or count < 1:
        msg = f"recovery partition count must be an int >= 1; received {count!r}"
        raise ValueError(msg)
    db_dir = Path(db_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with sqlite3.connect(db_dir / f"part-{i}.sqlite3") as con:
            con.executescript(_SCHEMA)
            con.execute(_GC_TABLE)
            con.execute("INSERT OR REPLACE INTO parts VALUES (?, ?)", (i, count))
        con.close()


DELETED = object()
"""Marker: the key's state was discarded in this epoch."""


class RecoveryStore:
    """Reads and writes the partitions of a recovery directory (used by runtimes)."""

    def __init__(self, config: RecoveryConfig, keep_epochs: Optional[int] = 0) -> None:
        """Open every partition and check they belong together.

        Args:
            config: The store.
            keep_epochs: Superseded epochs whose snapshots are kept (`epochs_per`);
                `None`: keep every snapshot.

        Raises:
            NoPartitionsError: The directory has no partitions.
            MissingPartitionsError: Some partitions are missing.
            InconsistentPartitionsError: Partitions disagree on the count, or some are
                too old to resume from: the others already deleted the snapshots
                their last epoch needs.
        """
        self.keep_epochs = keep_epochs
        db_dir = Path(config.db_dir)
        paths = sorted(db_dir.glob("part-*.sqlite3")) if db_dir.is_dir() else []
        if not paths:
            msg = (
                f"recovery directory {str(db_dir)!r} holds no partitions; create them with "
                f"`python -m flowspark.recovery {db_dir} 1`"
            )
            raise NoPartitionsError(msg)
        self._cons: dict[int, sqlite3.Connection] = {}
        counts = set()
        for p in paths:
            con = sqlite3.connect(p)
            try:
                row = con.execute("SELECT part_index, part_count FROM parts").fetchone()
            except sqlite3.DatabaseError as ex:
                con.close()
                self.close()
                msg = (
                    f"recovery partition {str(p)!r} is not a flowspark recovery partition ({ex}); "
                    f"re-create the directory with `python -m flowspark.recovery DB_DIR COUNT`"
                )
                raise InconsistentPartitionsError(msg) from None
            if row is None or row[0] in self._cons:
                con.close()
                self.close()
                what = "is not initialised" if row is None else f"repeats partition index {row[0]}"
                msg = f"recovery partition {str(p)!r} {what}; re-create the directory"
                raise InconsistentPartitionsError(msg)
            self._cons[row[0]] = con
            counts.add(row[1])
        if len(counts) != 1:
            self.close()
            msg = f"recovery partitions in {str(db_dir)!r} disagree on the partition count: {sorted(counts)}"
            raise InconsistentPartitionsError(msg)
        self.count = counts.pop()
        missing = sorted(set(range(self.count)) - set(self._cons))
        if missing:
            self.close()
            msg = f"recovery directory {str(db_dir)!r} is missing partitions {missing} of {self.count}"
            raise MissingPartitionsError(msg)
        for con in self._cons.values():
            con.execute(_GC_TABLE)  # also in a store written before it existed
        self._check_resumable(db_dir)

    def _check_resumable(self, db_dir: Path) -> None:
        """Raise `InconsistentPartitionsError` when some partition cannot resume from the resume epoch."""
        epoch = self.resume_epoch()
        gced = {}
        for index, con in self._cons.items():
            row = con.execute("SELECT MAX(gc_epoch) FROM gc").fetchone()
            gced[index] = row[0] or 0
        ahead = sorted(i for i, g in gced.items() if g > epoch)
        if not ahead:
            return
        lasts = {i: con.execute("SELECT MAX(epoch) FROM commits").fetchone()[0] or 0 for i, con in self._cons.items()}
        old = sorted(i for i, last in lasts.items() if last == epoch)
        self.close()
        msg = (
            f"recovery partitions {old} of {self.count} in {str(db_dir)!r} are too old to resume from epoch "
            f"{epoch} without data loss: partitions {ahead} already deleted the snapshots of that epoch "
            f"(they keep epochs {min(gced[i] for i in ahead)} and later); restore a newer backup of "
            f"partitions {old}, or back up all partitions within `RecoveryConfig.backup_interval` of each other"
        )
        raise InconsistentPartitionsError(msg)

    def close(self) -> None:
        """Close every connection."""
        for con in self._cons.values():
            con.close()

    def _part(self, step_id: str, key: str) -> sqlite3.Connection:
        return self._cons[adler32(f"{step_id}\0{key}".encode()) % self.count]

    def resume_epoch(self) -> int:
        """Return the last epoch committed in every partition (0 if none).

        Returns:
            The epoch.
        """
        per = []
        for con in self._cons.values():
            row = con.execute("SELECT MAX(epoch) FROM commits").fetchone()
            per.append(row[0] or 0)
        return min(per)

    def load(self) -> dict[str, dict[str, Any]]:
        """Return the state at the last committed epoch: `{step_id: {key: state}}`.

        Returns:
            The live states (discarded keys are absent).
        """
        epoch = self.resume_epoch()
        # A crash while an epoch was being written can leave it committed in some partitions
        # only; it is not resumable, so drop what it wrote before it is written again.
        for con in self._cons.values():
            with con:
                con.execute("DELETE FROM snaps WHERE epoch > ?", (epoch,))
                con.execute("DELETE FROM commits WHERE epoch > ?", (epoch,))
        out: dict[str, dict[str, Any]] = {}
        for con in self._cons.values():
            rows = con.execute(
                "SELECT s.step_id, s.state_key, s.ser_change FROM snaps s JOIN ("
                " SELECT step_id, state_key, MAX(epoch) AS e FROM snaps WHERE epoch <= ?"
                " GROUP BY step_id, state_key) m"
                " ON s.step_id = m.step_id AND s.state_key = m.state_key AND s.epoch = m.e",
                (epoch,),
            )
            for step_id, key, blob in rows:
                if blob is not None:
                    out.setdefault(step_id, {})[key] = pickle.loads(blob)
        return out

    def write(self, epoch: int, snaps: list[tuple[str, str, Any]]) -> None:
        """Write one epoch's snapshots and commit it.

        Args:
            epoch: The epoch being closed.
            snaps: `(step_id, key, state or DELETED)` triples.
        """
        by_con: dict[int, list[tuple[str, str, int, Optional[bytes]]]] = {}
        for step_id, key, state in snaps:
            blob = None if state is DELETED else pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
            con = self._part(step_id, key)
            by_con.setdefault(id(con), []).append((step_id, key, epoch, blob))
        for con in self._cons.values():
            rows = by_con.get(id(con), [])
            with con:
                con.executemany("INSERT OR REPLACE INTO snaps VALUES (?, ?, ?, ?)", rows)
                con.execute("INSERT OR REPLACE INTO commits VALUES (?)", (epoch,))
        # Only now is `epoch` committed in every partition (a write failing half-way leaves
        # the previous one as the resume point, which nothing has deleted yet). Delete what
        # no epoch from `epoch - keep_epochs` on needs.
        if self.keep_epochs is not None and epoch - self.keep_epochs >= 1:
            self._collect(epoch - self.keep_epochs)

    def _collect(self, upto: int) -> None:
        """In every partition, keep the state as of epoch `upto` and later only."""
        for index, con in self._cons.items():
            with con:
                # Versions older than a key's latest version at or before `upto`; then
                # deletion markers at or before `upto` (nothing older is left to hide).
                con.execute(
                    "DELETE FROM snaps WHERE epoch < (SELECT MAX(n.epoch) FROM snaps n"
                    " WHERE n.step_id = snaps.step_id AND n.state_key = snaps.state_key AND n.epoch <= ?)",
                    (upto,),
                )
                con.execute("DELETE FROM snaps WHERE epoch <= ? AND ser_change IS NULL", (upto,))
                con.execute(
                    "INSERT INTO gc VALUES (?, ?) ON CONFLICT (part_index) DO UPDATE"
                    " SET gc_epoch = MAX(gc_epoch, excluded.gc_epoch)",
                    (index, upto),
                )


def main(argv: Optional[list[str]] = None) -> None:
    """`python -m flowspark.recovery DB_DIR COUNT`: create a recovery store.

    Args:
        argv: Arguments (default: `sys.argv[1:]`).
    """
    parser = argparse.ArgumentParser(prog="python -m flowspark.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("db_dir", type=Path, help="directory to create the partitions in")
    parser.add_argument("part_count", type=int, help="number of partitions")
    args = parser.parse_args(argv)
    init_db_dir(args.db_dir, args.part_count)


if __name__ == "__main__":
    main()
