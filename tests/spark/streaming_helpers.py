"""Sources and logics shared by the streaming tests (module level: pickled by reference)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition
from flowspark.operators import StatefulLogic


class _DirPart(StatefulSourcePartition):
    def __init__(self, path: str, pos: Optional[tuple[int, int]], batch: int, bounded: bool) -> None:
        self.path = path
        self.file_no, self.line_no = pos or (0, 0)
        self.batch = batch
        self.bounded = bounded

    def _files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.path) if f.endswith(".jsonl"))

    def next_batch(self) -> list[Any]:
        files = self._files()
        if self.file_no >= len(files):
            if self.bounded:
                raise StopIteration
            return []
        with open(os.path.join(self.path, files[self.file_no])) as f:
            lines = f.read().splitlines()
        out = [json.loads(x) for x in lines[self.line_no : self.line_no + self.batch]]
        self.line_no += len(out)
        if self.line_no >= len(lines):
            self.file_no += 1
            self.line_no = 0
        return out

    def snapshot(self) -> tuple[int, int]:
        return (self.file_no, self.line_no)


class JsonlDirSource(FixedPartitionedSource):
    """Unbounded: every `<part>/*.jsonl` file, in name order; new files are picked up later."""

    def __init__(self, root: str, parts: list[str], batch: int = 100, bounded: bool = False) -> None:
        self.root = root
        self.parts = parts
        self.batch = batch
        self.bounded = bounded

    def is_bounded(self) -> bool:
        return self.bounded

    def list_parts(self) -> list[str]:
        return list(self.parts)

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _DirPart:
        return _DirPart(os.path.join(self.root, for_part), resume_state, self.batch, self.bounded)


def write_jsonl(path: str, rows: list[Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def delta_log_actions(table: Any, kind: str) -> list[dict[str, Any]]:
    """The `kind` actions (`add`, `txn`, ...) of a Delta table's transaction log, in commit order."""
    from pathlib import Path

    out = []
    for f in sorted((Path(table) / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if kind in action:
                out.append(action[kind])
    return out


def count_mapper(state: Optional[int], _value: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


class FileClock:
    """A clock the workers read from a file the test writes (an injected clock; no sleeping)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def set(self, t: datetime) -> None:
        with open(self.path + ".tmp", "w") as f:
            f.write(t.isoformat())
        os.replace(self.path + ".tmp", self.path)

    def __call__(self) -> datetime:
        with open(self.path) as f:
            return datetime.fromisoformat(f.read().strip())


class ActiveUser(StatefulLogic):
    """Counts a user's events in a session; emits ("ended", count) after `idle` without events."""

    IDLE = timedelta(minutes=30)

    def __init__(self, state: Optional[tuple[int, datetime]]) -> None:
        self.count, self.last = state if state is not None else (0, None)

    def on_item(self, value: Any) -> tuple[list[Any], bool]:
        from flowspark._time import utc_now

        self.count += 1
        self.last = utc_now()
        return [("active", self.count)], StatefulLogic.RETAIN

    def on_notify(self) -> tuple[list[Any], bool]:
        return [("ended", self.count)], StatefulLogic.DISCARD

    def notify_at(self) -> Optional[datetime]:
        return self.last + self.IDLE if self.last is not None else None

    def snapshot(self) -> tuple[int, datetime]:
        return (self.count, self.last)


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def parity_key(kv: Any) -> str:
    return "even" if kv[1] % 2 == 0 else "odd"


def count_row(kv: Any) -> dict:
    return {"user": kv[0], "n": kv[1]}


def count_row_with_list(kv: Any) -> dict:
    return {"user": kv[0], "n": kv[1], "seen": list(range(kv[1]))}


def not_a_row(kv: Any) -> Any:
    return kv  # a tuple: a SparkSink needs dicts


class ListSource(FixedPartitionedSource):
    """Bounded: partition `p` holds `items[p]` (batches of `batch` items)."""

    def __init__(self, items: dict[str, list[Any]], batch: int = 3, bounded: bool = False) -> None:
        self.items = items
        self.batch = batch
        self.bounded = bounded

    def is_bounded(self) -> bool:
        return self.bounded

    def list_parts(self) -> list[str]:
        return list(self.items)

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _ListPart:
        return _ListPart(self.items[for_part], resume_state or 0, self.batch)


class EndingListSource(ListSource):
    """`ListSource` whose partitions end once read: the in-memory reference of a Python stream."""

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
        part = super().build_part(step_id, for_part, resume_state)
        read = part.next_batch

        def next_batch() -> list[Any]:
            if part.pos >= len(part.items):
                raise StopIteration
            return read()

        part.next_batch = next_batch
        return part


class _ListPart(StatefulSourcePartition):
    def __init__(self, items: list[Any], pos: int, batch: int) -> None:
        self.items, self.pos, self.batch = items, pos, batch

    def next_batch(self) -> list[Any]:
        out = self.items[self.pos : self.pos + self.batch]
        self.pos += len(out)
        return out

    def snapshot(self) -> int:
        return self.pos


def dict_count_mapper(state: Optional[dict[str, int]], _value: Any) -> tuple[dict[str, int], int]:
    """`count_mapper`'s next version: the state is a dict (an old int state makes `dict()` raise)."""
    st = dict(state or {})
    st["n"] = st.get("n", 0) + 1
    return st, st["n"]


class Tally:
    """A state class of an importable module (pickled by reference)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tally) and other.n == self.n

    __hash__ = None  # type: ignore[assignment]


class AlwaysPast(StatefulLogic):
    """Every call asks for a notification at a time long past (item, notify and eof emits say which call)."""

    def on_item(self, value: Any) -> tuple[list[Any], bool]:
        return [("item", value)], False

    def on_notify(self) -> tuple[list[Any], bool]:
        return [("notify",)], False

    def on_eof(self) -> tuple[list[Any], bool]:
        return [("eof",)], True

    def notify_at(self) -> Optional[datetime]:
        return datetime(2000, 1, 1, tzinfo=timezone.utc)

    def snapshot(self) -> Any:
        return None


class PastOnItem(AlwaysPast):
    """Each item asks for a notification at a time long past; `on_notify` clears it."""

    def __init__(self) -> None:
        self.at: Optional[datetime] = None

    def on_item(self, value: Any) -> tuple[list[Any], bool]:
        self.at = datetime(2000, 1, 1, tzinfo=timezone.utc)
        return super().on_item(value)

    def on_notify(self) -> tuple[list[Any], bool]:
        self.at = None
        return super().on_notify()

    def notify_at(self) -> Optional[datetime]:
        return self.at
