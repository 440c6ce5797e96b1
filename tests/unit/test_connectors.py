"""Built-in connectors: FileSource, DirSource, CSVSource, FileSink, DirSink, StdOutSink."""

from __future__ import annotations

from datetime import timedelta
from zlib import adler32

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkBuildError, FlowsparkRuntimeError, FlowsparkTypeError, RecoveryError
from flowspark.inputs import CSVSource, DirSource, FileSource
from flowspark.outputs import DirSink, FileSink, StdOutSink
from flowspark.recovery import RecoveryConfig, init_db_dir
from flowspark.testing import TestingSink, TestingSource, run_main

HOUR = timedelta(hours=1)


def _drain(part):
    out = []
    while True:
        try:
            out.extend(part.next_batch())
        except StopIteration:
            return out


def _run_source(source, **kw):
    flow = Dataflow("f")
    out = []
    op.output("out", op.input("inp", flow, source), TestingSink(out))
    run_main(flow, **kw)
    return out


def _only_part(source):
    (key,) = source.list_parts()
    return key


def _keyed(s):
    return ("k", s)


# -- FileSource ---------------------------------------------------------------


def test_file_source_yields_lines_without_newlines(tmp_path):
    p = tmp_path / "in.txt"
    p.write_bytes("one\ntwo\r\n\nzwölf\nlast-no-newline".encode())
    assert _run_source(FileSource(p)) == ["one", "two", "", "zwölf", "last-no-newline"]


def test_file_source_accepts_str_path_and_is_bounded(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("a\n")
    src = FileSource(str(p))
    assert src.is_bounded() is True
    assert _run_source(src) == ["a"]


def test_file_source_empty_file_gives_nothing(tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("")
    assert _run_source(FileSource(p)) == []


def test_file_source_batches_have_batch_size_lines(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("".join(f"{i}\n" for i in range(7)))
    src = FileSource(p, batch_size=3)
    part = src.build_part("f.inp", _only_part(src), None)
    assert part.next_batch() == ["0", "1", "2"]
    assert part.next_batch() == ["3", "4", "5"]
    assert part.next_batch() == ["6"]
    with pytest.raises(StopIteration):
        part.next_batch()
    part.close()


def test_file_source_one_partition_per_file_named_by_fs_id(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("a\n")
    src = FileSource(p, get_fs_id=lambda _d: "SHARED")
    assert src.list_parts() == [f"SHARED::{p}"]


def test_file_source_resumes_from_snapshot_offset(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("a\nbb\nccc\ndddd\n")
    src = FileSource(p, batch_size=2)
    key = _only_part(src)
    part = src.build_part("f.inp", key, None)
    assert part.next_batch() == ["a", "bb"]
    offset = part.snapshot()
    assert offset == len(b"a\nbb\n")
    part.close()
    resumed = src.build_part("f.inp", key, offset)
    assert _drain(resumed) == ["ccc", "dddd"]
    assert resumed.snapshot() == p.stat().st_size
    resumed.close()


def test_file_source_offset_is_in_bytes_for_multibyte_text(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("äöü\nnext\n", encoding="utf-8")
    src = FileSource(p, batch_size=1)
    part = src.build_part("f.inp", _only_part(src), None)
    assert part.next_batch() == ["äöü"]
    assert part.snapshot() == len("äöü\n".encode())
    part.close()
    assert _drain(src.build_part("f.inp", _only_part(src), len("äöü\n".encode()))) == ["next"]


def test_file_source_missing_file_names_path_and_fix(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"nope\.txt.*does not exist.*create it or fix the path"):
        FileSource(missing)


def test_file_source_on_directory_points_to_dir_source(tmp_path):
    with pytest.raises(IsADirectoryError, match="use DirSource"):
        FileSource(tmp_path)


def test_file_source_removed_before_run_names_step_and_path(tmp_path):
    p = tmp_path / "gone.txt"
    p.write_text("a\n")
    src = FileSource(p)
    p.unlink()
    with pytest.raises(FlowsparkRuntimeError, match=r"'f\.inp'.*gone\.txt.*does not exist") as ei:
        _run_source(src)
    assert ei.value.step_id == "f.inp"


@pytest.mark.parametrize("bad", [0, -1, "10", 1.5, True])
def test_file_source_bad_batch_size(tmp_path, bad):
    p = tmp_path / "in.txt"
    p.write_text("a\n")
    with pytest.raises(FlowsparkTypeError, match=r"batch_size must be an int >= 1"):
        FileSource(p, batch_size=bad)


def test_fs_id_must_not_contain_separator(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("a\n")
    with pytest.raises(FlowsparkTypeError, match="without '::'"):
        FileSource(p, get_fs_id=lambda _d: "a::b")


def test_file_source_refuses_a_partition_of_another_file(tmp_path):
    p = tmp_path / "in.txt"
    p.write_text("a\n")
    with pytest.raises(ValueError, match="not this source's file"):
        FileSource(p).build_part("f.inp", "x::/elsewhere.txt", None)


# -- DirSource ----------------------------------------------------------------


def _make_dir(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("a1\na2\n")
    (d / "b.txt").write_text("b1\n")
    (d / "c.log").write_text("c1\n")
    (d / "sub.txt").mkdir()  # a matching directory is not a file: skipped
    return d


def test_dir_source_one_partition_per_matching_file(tmp_path):
    d = _make_dir(tmp_path)
    src = DirSource(d, "*.txt", get_fs_id=lambda _d: "FS")
    assert src.list_parts() == ["FS::a.txt", "FS::b.txt"]
    assert src.is_bounded() is True


def test_dir_source_reads_every_line_of_every_file(tmp_path):
    d = _make_dir(tmp_path)
    assert sorted(_run_source(DirSource(d))) == ["a1", "a2", "b1", "c1"]
    assert sorted(_run_source(DirSource(d, "*.txt"))) == ["a1", "a2", "b1"]


def test_dir_source_keeps_each_files_line_order(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("".join(f"x{i}\n" for i in range(50)))
    (d / "y").write_text("".join(f"y{i}\n" for i in range(50)))
    out = _run_source(DirSource(d, batch_size=7))
    assert [s for s in out if s[0] == "x"] == [f"x{i}" for i in range(50)]
    assert [s for s in out if s[0] == "y"] == [f"y{i}" for i in range(50)]


def test_dir_source_resumes_each_file_at_its_offset(tmp_path):
    d = _make_dir(tmp_path)
    src = DirSource(d, "*.txt")
    key_a, key_b = src.list_parts()
    part = src.build_part("f.inp", key_a, None)
    assert part.next_batch() == ["a1", "a2"]
    part.close()
    assert _drain(src.build_part("f.inp", key_a, len(b"a1\n"))) == ["a2"]
    assert _drain(src.build_part("f.inp", key_b, None)) == ["b1"]


def test_dir_source_glob_can_recurse(tmp_path):
    d = tmp_path / "d"
    (d / "x" / "y").mkdir(parents=True)
    (d / "x" / "y" / "deep.txt").write_text("deep\n")
    src = DirSource(d, "**/*.txt", get_fs_id=lambda _d: "FS")
    assert src.list_parts() == ["FS::x/y/deep.txt"]
    assert _run_source(src) == ["deep"]


def test_dir_source_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"input directory .*nodir.* does not exist.*create it"):
        DirSource(tmp_path / "nodir")


def test_dir_source_on_a_file_points_to_file_source(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("a\n")
    with pytest.raises(NotADirectoryError, match="use FileSource"):
        DirSource(p)


def test_dir_source_empty_directory_ends_at_once(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    assert _run_source(DirSource(d)) == []


# -- CSVSource ----------------------------------------------------------------


def test_csv_source_yields_a_dict_per_row(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text('index,value,instance\n0,0.132,24ae8d\n1,"4,5",c6585a\n')
    src = CSVSource(p)
    assert src.is_bounded() is True
    assert _run_source(src) == [
        {"index": "0", "value": "0.132", "instance": "24ae8d"},
        {"index": "1", "value": "4,5", "instance": "c6585a"},
    ]


def test_csv_source_passes_format_params(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text("a;b\r\n1;2\r\n")
    assert _run_source(CSVSource(p, delimiter=";")) == [{"a": "1", "b": "2"}]


def test_csv_source_resumes_after_last_row_and_keeps_header(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text('k,v\na,"multi\nline"\nb,2\nc,3\n')
    src = CSVSource(p, batch_size=1)
    key = _only_part(src)
    part = src.build_part("f.inp", key, None)
    assert part.next_batch() == [{"k": "a", "v": "multi\nline"}]
    offset = part.snapshot()
    assert offset == len(b'k,v\na,"multi\nline"\n')
    part.close()
    assert _drain(src.build_part("f.inp", key, offset)) == [{"k": "b", "v": "2"}, {"k": "c", "v": "3"}]


def test_csv_source_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"CSVSource: input file .*x\.csv.* does not exist"):
        CSVSource(tmp_path / "x.csv")


def test_csv_source_bad_format_params(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text("a\n1\n")
    with pytest.raises(FlowsparkTypeError, match="bad csv format parameters"):
        CSVSource(p, delimiter="too long")


# -- FileSink -----------------------------------------------------------------


def _write_flow(items, sink):
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, TestingSource(items)), sink)
    return flow


def test_file_sink_writes_values_with_end(tmp_path):
    p = tmp_path / "out.txt"
    run_main(_write_flow([("k", "a"), ("other", "b"), ("k", "c")], FileSink(p)))
    assert p.read_text() == "a\nb\nc\n"


def test_file_sink_custom_end_and_str_path(tmp_path):
    p = tmp_path / "out.txt"
    run_main(_write_flow([("k", "a"), ("k", "b")], FileSink(str(p), end=";")))
    assert p.read_text() == "a;b;"


def test_file_sink_fresh_run_replaces_old_content(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("stale content that is longer\n")
    run_main(_write_flow([("k", "new")], FileSink(p)))
    assert p.read_text() == "new\n"


def test_file_sink_is_a_single_partition(tmp_path):
    sink = FileSink(tmp_path / "o")
    assert sink.list_parts() == [str(tmp_path / "o")]
    assert {sink.part_fn(k) for k in ["a", "b", "zzz"]} == {0}


def test_file_sink_truncates_to_resume_offset(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("kept\nreplayed\n")
    sink = FileSink(p)
    part = sink.build_part("f.out", str(p), len(b"kept\n"))
    part.write_batch(["again"])
    assert part.snapshot() == len(b"kept\nagain\n")
    part.close()
    assert p.read_text() == "kept\nagain\n"


def test_file_sink_resume_offset_past_end_is_a_recovery_error(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("ab\n")
    with pytest.raises(RecoveryError, match=r"'f\.out'.*offset 100 is past the end"):
        FileSink(p).build_part("f.out", str(p), 100)
    assert p.read_text() == "ab\n"


@pytest.mark.parametrize("bad", [42, b"bytes", None, ("a", "b")])
def test_file_sink_non_str_value_names_step_and_item(tmp_path, bad):
    p = tmp_path / "out.txt"
    flow = _write_flow([("k", "ok"), ("k", bad)], FileSink(p))
    with pytest.raises(FlowsparkTypeError, match=r"step 'f\.out': FileSink writes str values; received ") as ei:
        run_main(flow)
    assert repr(bad) in str(ei.value)
    assert type(bad).__name__ in str(ei.value)


def test_file_sink_unkeyed_item_is_rejected_with_step(tmp_path):
    flow = _write_flow(["not keyed"], FileSink(tmp_path / "o"))
    with pytest.raises(FlowsparkTypeError, match=r"'f\.out'.*'not keyed'.*key_on"):
        run_main(flow)


def test_file_sink_missing_directory(tmp_path):
    flow = _write_flow([("k", "a")], FileSink(tmp_path / "no" / "out.txt"))
    with pytest.raises(FlowsparkRuntimeError, match=r"'f\.out'.*no/out\.txt.*does not exist; create it first") as ei:
        run_main(flow)
    assert isinstance(ei.value.__cause__, FileNotFoundError)


def test_file_sink_bad_end():
    with pytest.raises(FlowsparkTypeError, match="end must be a str"):
        FileSink("x", end=None)


# -- DirSink ------------------------------------------------------------------


def test_dir_sink_routes_each_key_to_one_file_in_order(tmp_path):
    items = [(k, f"{k}{i}") for i in range(5) for k in ["a", "b", "c", "d"]]
    run_main(_write_flow(items, DirSink(tmp_path, 3)))
    files = {p.name: p.read_text().splitlines() for p in tmp_path.iterdir()}
    assert set(files) == {"part_0", "part_1", "part_2"}
    for k in "abcd":
        expected = [f"{k}{i}" for i in range(5)]
        name = f"part_{adler32(k.encode()) % 3}"
        assert [v for v in files[name] if v[0] == k] == expected
    assert sorted(v for vs in files.values() for v in vs) == sorted(v for _, v in items)


def test_dir_sink_custom_namer_and_assignment(tmp_path):
    sink = DirSink(tmp_path, 2, file_namer=lambda i, n: f"{i}-of-{n}.txt", assign_file=lambda k: int(k), end="|")
    run_main(_write_flow([("0", "x"), ("1", "y"), ("3", "z")], sink))
    assert (tmp_path / "0-of-2.txt").read_text() == "x|"
    assert (tmp_path / "1-of-2.txt").read_text() == "y|z|"


def test_dir_sink_non_str_value_names_step_and_item(tmp_path):
    flow = _write_flow([("k", {"n": 1})], DirSink(tmp_path, 2))
    with pytest.raises(FlowsparkTypeError, match=r"step 'f\.out': DirSink writes str values; received \{'n': 1\}"):
        run_main(flow)


def test_dir_sink_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"output directory .*nodir.* does not exist; create it first"):
        DirSink(tmp_path / "nodir", 2)


@pytest.mark.parametrize("bad", [0, "2", None])
def test_dir_sink_bad_file_count(tmp_path, bad):
    with pytest.raises(FlowsparkTypeError, match="file_count must be an int >= 1"):
        DirSink(tmp_path, bad)


def test_dir_sink_namer_must_give_distinct_names(tmp_path):
    with pytest.raises(FlowsparkBuildError, match="distinct names"):
        DirSink(tmp_path, 2, file_namer=lambda i, n: "same")


# -- StdOutSink ---------------------------------------------------------------


def test_stdout_sink_prints_each_item(capsys):
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, TestingSource(["a", 1, ("k", 2)])), StdOutSink())
    run_main(flow)
    assert capsys.readouterr().out == "a\n1\n('k', 2)\n"


def test_connectors_importable_from_bytewax_style_paths():
    from flowspark.connectors.files import CSVSource as C
    from flowspark.connectors.files import DirSink as DS
    from flowspark.connectors.files import FileSink as FS
    from flowspark.connectors.stdio import StdOutSink as S

    assert (C, DS, FS, S) == (CSVSource, DirSink, FileSink, StdOutSink)


# -- recovery -----------------------------------------------------------------


def _file_flow(inp, out):
    flow = Dataflow("copy")
    s = op.input("inp", flow, FileSource(inp, batch_size=2))
    s = op.map("upper", s, lambda line: ("k", line.upper()))
    op.output("out", s, FileSink(out))
    return flow


def test_recovery_continuation_reads_new_lines_and_appends_without_duplicates(tmp_path):
    inp, out, db = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "rec"
    init_db_dir(db, 1)
    rc = RecoveryConfig(db)
    inp.write_text("a\nb\nc\n")
    run_main(_file_flow(inp, out), epoch_interval=HOUR, recovery_config=rc)
    assert out.read_text() == "A\nB\nC\n"
    with inp.open("a") as f:
        f.write("d\ne\n")
    run_main(_file_flow(inp, out), epoch_interval=HOUR, recovery_config=rc)
    assert out.read_text() == "A\nB\nC\nD\nE\n"
    # Nothing new: a third run changes nothing.
    run_main(_file_flow(inp, out), epoch_interval=HOUR, recovery_config=rc)
    assert out.read_text() == "A\nB\nC\nD\nE\n"


def test_recovery_continuation_of_csv_and_dir_sources(tmp_path):
    d, db = tmp_path / "d", tmp_path / "rec"
    d.mkdir()
    (d / "x.csv").write_text("k,v\na,1\n")
    init_db_dir(db, 2)
    rc = RecoveryConfig(db)
    assert _run_source(CSVSource(d / "x.csv"), recovery_config=rc) == [{"k": "a", "v": "1"}]
    with (d / "x.csv").open("a") as f:
        f.write("b,2\n")
    assert _run_source(CSVSource(d / "x.csv"), recovery_config=rc) == [{"k": "b", "v": "2"}]

    db2 = tmp_path / "rec2"
    init_db_dir(db2, 1)
    rc2 = RecoveryConfig(db2)
    (d / "l1.txt").write_text("1a\n")
    assert _run_source(DirSource(d, "*.txt"), recovery_config=rc2) == ["1a"]
    with (d / "l1.txt").open("a") as f:
        f.write("1b\n")
    (d / "l2.txt").write_text("2a\n")  # a new file is a new partition, read from its start
    assert sorted(_run_source(DirSource(d, "*.txt"), recovery_config=rc2)) == ["1b", "2a"]


def test_recovery_after_abort_truncates_replayed_output(tmp_path):
    out, db = tmp_path / "out.txt", tmp_path / "rec"
    init_db_dir(db, 1)
    rc = RecoveryConfig(db)
    items = [("k", "a"), TestingSource.EOF(), ("k", "b"), TestingSource.ABORT(), ("k", "c")]

    def run():
        run_main(_write_flow(items, FileSink(out)), epoch_interval=HOUR, recovery_config=rc)

    run()  # writes a, reaches EOF: snapshot with the sink at offset 2
    assert out.read_text() == "a\n"
    run()  # writes b, aborts before any snapshot
    assert out.read_text() == "a\nb\n"
    run()  # resumes at the EOF snapshot: the sink cuts "b" off, then b and c are replayed
    assert out.read_text() == "a\nb\nc\n"


def test_recovery_dir_sink_resumes_every_file(tmp_path):
    outd, db = tmp_path / "outd", tmp_path / "rec"
    outd.mkdir()
    init_db_dir(db, 1)
    rc = RecoveryConfig(db)
    items = [("a", "a1"), ("b", "b1"), TestingSource.EOF(), ("a", "a2"), ("b", "b2"), TestingSource.ABORT()]
    items += [("a", "a3")]

    def run():
        run_main(_write_flow(items, DirSink(outd, 2, assign_file=lambda k: 0 if k == "a" else 1)), recovery_config=rc)

    run()
    run()
    assert (outd / "part_0").read_text() == "a1\na2\n"
    run()
    assert (outd / "part_0").read_text() == "a1\na2\na3\n"
    assert (outd / "part_1").read_text() == "b1\nb2\n"


def test_missing_relative_path_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'data/in\.txt' does not exist \(relative to the current directory"):
        FileSource("data/in.txt")
    with pytest.raises(FileNotFoundError, match=r"'outd' does not exist \(relative to the current directory"):
        DirSink("outd", 1)


# -- differential: the same files through Bytewax 0.21.1 ----------------------------


@pytest.mark.bytewax
def test_file_connectors_match_bytewax(tmp_path):
    bw_op = pytest.importorskip("bytewax.operators")
    from bytewax.connectors import files as bw_files
    from bytewax.dataflow import Dataflow as BwDataflow
    from bytewax.testing import TestingSink as BwSink
    from bytewax.testing import TestingSource as BwSource
    from bytewax.testing import run_main as bw_run_main

    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("one\ntwo\r\n\nthree")
    (d / "b.txt").write_text("x\ny\n")
    (tmp_path / "in.csv").write_text('k,v\na,1\nb,"2,5"\nc,"multi\nline"\n')

    def ours(make_source):
        return _run_source(make_source(FileSource, DirSource, CSVSource))

    def theirs(make_source):
        flow = BwDataflow("f")
        out = []
        bw_op.output(
            "out",
            bw_op.input("inp", flow, make_source(bw_files.FileSource, bw_files.DirSource, bw_files.CSVSource)),
            BwSink(out),
        )
        bw_run_main(flow)
        return out

    cases = [
        lambda F, D, C: F(d / "a.txt", batch_size=2),
        lambda F, D, C: D(d, "*.txt"),
        lambda F, D, C: C(tmp_path / "in.csv"),
    ]
    for make in cases:
        assert sorted(map(repr, ours(make))) == sorted(map(repr, theirs(make)))

    ours_out, theirs_out = tmp_path / "ours.txt", tmp_path / "theirs.txt"
    items = [("k", "a"), ("j", "b"), ("k", "c")]
    run_main(_write_flow(items, FileSink(ours_out, end="|\n")))
    flow = BwDataflow("f")
    bw_op.output("out", bw_op.input("inp", flow, BwSource(items)), bw_files.FileSink(theirs_out, end="|\n"))
    bw_run_main(flow)
    assert ours_out.read_bytes() == theirs_out.read_bytes()
