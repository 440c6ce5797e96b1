"""Recovery for the in-memory executor: epoch snapshots in SQLite partitions.

Create the store once with `init_db_dir(db_dir, count)` (or
`python -m flowspark.recovery DB_DIR COUNT`), then pass
`RecoveryConfig(db_dir)` to `run_main`. At every epoch boundary the executor
writes the state of every key touched in the epoch, every source partition's
position and every sink partition's state, then commits the epoch. A later run
with the same store resumes from the last committed epoch: after an EOF it
continues the input with state restored; after an abort or crash it replays the
input since the last snapshot (output of that stretch may be repeated).
"""

from __future__ import annotations

import argparse
import pickle
import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional
from zlib import adler32

from flowspark.errors import InconsistentPartitionsError, MissingPartitionsError, NoPartitionsError

__all__ = ["RecoveryConfig", "init_db_dir"]

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


@dataclass(frozen=True)
class RecoveryConfig:
    """Where and how to keep recovery snapshots.

    Args:
        db_dir: Directory created by `init_db_dir`.
        backup_interval: Keep snapshots older than the last committed epoch for this
            long (accepted for Bytewax compatibility; the executor keeps only what it
            needs to resume when this is `None`).
    """

    db_dir: Path
    backup_interval: Optional[timedelta] = None


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
            con.execute("INSERT OR REPLACE INTO parts VALUES (?, ?)", (i, count))
        con.close()


DELETED = object()
"""Marker: the key's state was discarded in this epoch."""


class RecoveryStore:
    """Reads and writes the partitions of a recovery directory (used by runtimes)."""

    def __init__(self, config: RecoveryConfig) -> None:
        """Open every partition and check they belong together.

        Raises:
            NoPartitionsError: The directory has no partitions.
            MissingPartitionsError: Some partitions are missing.
            InconsistentPartitionsError: Partitions disagree on the count.
        """
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
                # Garbage-collect up to the previous epoch only: it is committed in every
                # partition (the resume point is the oldest partition's last commit), while
                # this one may not be if the write fails half-way. Drop older versions of
                # keys rewritten in it, then deletion markers that no longer hide anything.
                prev = con.execute("SELECT MAX(epoch) FROM commits WHERE epoch < ?", (epoch,)).fetchone()[0]
                if prev is not None:
                    con.execute(
                        "DELETE FROM snaps WHERE epoch < ? AND EXISTS (SELECT 1 FROM snaps n"
                        " WHERE n.step_id = snaps.step_id AND n.state_key = snaps.state_key"
                        " AND n.epoch = ?)",
                        (prev, prev),
                    )
                    con.execute("DELETE FROM snaps WHERE epoch <= ? AND ser_change IS NULL", (prev,))
                con.executemany("INSERT OR REPLACE INTO snaps VALUES (?, ?, ?, ?)", rows)
                con.execute("INSERT OR REPLACE INTO commits VALUES (?)", (epoch,))


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
