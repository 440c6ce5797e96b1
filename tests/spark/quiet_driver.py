"""Runs the docs' streaming quick-start, every streaming example and the batch example in one process.

Used by test_quiet_success.py, which reads what this process prints on stderr.

Usage: python quiet_driver.py WORK_DIR
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start(work: Path, layout: str = "") -> None:
    """docs/streaming.md's first snippet, with its `/data/...` paths under `work`, over one JSON file.

    With `layout`, run with that `state_layout` (the key and chunk layouts run on
    transformWithStateInPandas, whose driver-side worker prints debug lines unless silenced).
    """
    text = (ROOT / "docs" / "streaming.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    code = code.replace('"/data/', f'"{work}/')
    if layout:
        run_call = 'trigger="available_now")'
        assert run_call in code, code
        code = code.replace(run_call, f'trigger="available_now", state_layout={layout!r})')
    (work / "clicks").mkdir(parents=True)
    rows = [{"user": u, "url": "/"} for u in ["ann", "bob", "ann"]]
    (work / "clicks" / "1.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    exec(compile(code, "docs/streaming.md", "exec"), {"__name__": "quick_start"})  # noqa: S102


def main() -> None:
    work = Path(sys.argv[1])
    quick_start(work)
    quick_start(work / "chunk", "chunk")
    for example in sorted((ROOT / "examples" / "streaming").glob("*.py")):
        # kafka_anomalies.py needs a broker: test_kafka_e2e.py runs it (python -m nox -s kafka)
        if example.name not in ("common.py", "kafka_anomalies.py"):
            runpy.run_path(str(example), run_name="__main__")
    sys.argv = [str(ROOT / "examples" / "batch_job.py")]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise


if __name__ == "__main__":
    main()
