"""A Spark Connect client of one pyspark line against a server of another (the version matrix runs it).

`python -m nox -s compat` runs this module in each older line's virtualenv with
`FLOWSPARK_TEST_SERVER_HOME` naming the newest line's pyspark (the interpreter running nox):
this line's client, the newest line's server and workers. The full suite (one pyspark) skips it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from connect_server import scenario, start_server, stop_server

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SERVER_HOME = os.environ.get("FLOWSPARK_TEST_SERVER_HOME", "")


def _version(python_or_home: str) -> str:
    """The pyspark version of a pyspark installation directory."""
    text = (Path(python_or_home) / "version.py").read_text()
    return text.split("=")[1].strip().strip("\"'")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import pyspark  # noqa: TID251

    if not SERVER_HOME or Path(SERVER_HOME).resolve() == Path(pyspark.__file__).parent.resolve():
        pytest.skip("a client/server pair of two pyspark lines: run by the version matrix (python -m nox -s compat)")
    # The server's Python workers run the server's pyspark: the interpreter next to its installation.
    worker = Path(SERVER_HOME).parent.parents[2] / "bin" / "python3"  # <prefix>/lib/pythonX.Y/site-packages/pyspark
    assert worker.exists(), f"no interpreter at {worker} for the server's pyspark {SERVER_HOME}"
    url, proc = start_server(tmp_path_factory.mktemp("connect-server"), home=SERVER_HOME, worker_python=str(worker))
    yield url
    stop_server(proc)


def test_the_server_is_another_line(server):
    import pyspark  # noqa: TID251

    assert _version(SERVER_HOME)[:3] != pyspark.__version__[:3], (_version(SERVER_HOME), pyspark.__version__)


def test_a_batch_job_through_a_server_of_another_line(server, tmp_path):
    res = scenario("two_sinks", server, tmp_path)
    assert res["rows"] == {
        "counts": [[10, "u0"], [10, "u1"], [10, "u2"]],
        "totals": [["u0", 135], ["u1", 145], ["u2", 155]],
    }


def test_a_stream_through_a_server_of_another_line(server, tmp_path):
    from flowspark.spark.versions import PYTHON_STREAM_SOURCE, lacks

    if lacks(PYTHON_STREAM_SOURCE) is not None:  # the client defines the Python data source
        pytest.skip(f"the stream reads a Python source: {lacks(PYTHON_STREAM_SOURCE)} (tests/unit/test_versions.py)")
    res = scenario("stream", server, tmp_path)
    expected = [tuple(x) for x in res["expected"]]
    got = [tuple(x) for x in res["first"] + res["second"]]
    assert sorted(got) == sorted(expected)
    for key in {k for k, _ in expected}:
        assert [n for k, n in got if k == key] == [n for k, n in expected if k == key]
