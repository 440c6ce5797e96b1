"""The main job: user sessions with a 30-minute inactivity timeout, as a Spark streaming query.

What it shows, on local Spark in-process (the embedded default):

1. A directory of JSON click files is read as a stream (`SparkSource(..., streaming=True)`);
   each user's open session is keyed state in the query's checkpoint.
2. Run 1 processes the first file (`available_now`), printing one progress line per
   micro-batch, and stops.
3. A second file arrives 31 minutes later (processing time, on an injected clock so the run
   takes seconds). Run 2 continues from the checkpoint: the first run's sessions time out
   (`notify_at`) and are written, the new clicks open new sessions.
4. The same events run through the in-memory executor (with a pause of the same length and
   every key resumed from its snapshot after each batch, as streaming does); the job says
   whether both give the same sessions.

    python examples/main_job.py [WORK_DIR]

The rows are written as parquet to `WORK_DIR/out` (default: a new temporary directory).
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "streaming"))
from common import (  # noqa: E402
    FileClock,  # noqa: E402
    read_rows,
    run,
    stage_file,
)
from sessions import BATCH_1, BATCH_2, local, streaming  # noqa: E402

from flowspark.testing import TestingSource, run_main  # noqa: E402

T0 = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)
LATER = timedelta(minutes=31)


def _key(row: dict[str, Any]) -> tuple:
    return (row["user"], row["start"], row["end"], row["clicks"])


def main(argv: list[str]) -> int:
    work = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="flowspark-main-job-"))
    clock = FileClock(work / "now")
    seen = 0
    for i, (batch, at) in enumerate([(BATCH_1, T0), (BATCH_2, T0 + LATER)], start=1):
        stage_file(work / "in", f"{i:04d}.json", batch)
        clock.set(at)
        print(f"== run {i}: {len(batch)} new clicks, processing time {at:%H:%M} (checkpoint {work / 'chk'})")
        t = time.perf_counter()
        run(streaming(work / "in", work / "out"), work / "chk", clock=clock)
        rows = read_rows(work / "out")
        print(f"   {len(rows) - seen} session(s) written in {time.perf_counter() - t:.1f} s")
        for row in sorted(rows[seen:], key=_key):
            print(f"   {row['user']:<5} {row['start']} .. {row['end']}  {row['clicks']} click(s)")
        seen = len(rows)
    local_rows: list[Any] = []
    events = [*BATCH_1, TestingSource.PAUSE(LATER), *BATCH_2, TestingSource.ABORT()]  # no end of input
    run_main(local(events, local_rows), clock="logical", start_time=T0, roundtrip_state=True)
    same = sorted(map(_key, read_rows(work / "out"))) == sorted(map(_key, local_rows))
    print(f"in-memory executor gives the same sessions: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
