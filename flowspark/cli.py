"""The `flowspark` command line (also `python -m flowspark`).

```
flowspark run IMPORT_STR [--runtime local|spark] [-w N] [--master URL | --remote sc://HOST:PORT]
                         [--checkpoint DIR]
                         [--trigger available_now|"N seconds"] [--conf key=value ...]
flowspark plan IMPORT_STR [--format text|mermaid|json] [-r] [--spark [--no-physical]]
flowspark submit IMPORT_STR --master spark://HOST:PORT [--archives env.tar.gz#environment]
                            [--py-files a.zip,b.py] [--conf key=value ...] [--dry-run]
flowspark state CHECKPOINT [--step STEP_ID] [--key KEY] [--batch-id N] [--format text|json]
```

`IMPORT_STR` is `module[:attr]` or `path/file.py[:attr]` (see
`flowspark._importstr`); `attr` defaults to `flow` and may be a factory call
with literal arguments. `python -m flowspark.run` stays the Bytewax-style
shortcut for the in-memory executor.

`run` uses the in-memory executor (`-w N`: N workers in this process, as Bytewax's
`python -m bytewax.run -w N`) unless `--runtime spark` is given (or any of
`--master`, `--remote`, `--checkpoint`, `--trigger`, `--conf`, which only make
sense on Spark; `--remote` runs through a Spark Connect server). On Spark, a
flow whose sources are all bounded runs as batch jobs and shows its progress
on stderr; `--checkpoint` / `--trigger` or an unbounded
source need the streaming runtime.

Every problem with the command line or the flow's setup (a bad import string,
a missing module or attribute, an object that is not a Dataflow, a flow Spark
cannot run, an unreachable master) prints one line `flowspark: error: ...` on
stderr and exits with 1; `--traceback` shows the Python traceback instead.
A failure of the flow's own code on Spark prints the step id and the
exception's type and message on one line, exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from flowspark._args import conf_pair, parse_trigger, positive_int, trigger_arg, ttl_seconds

__all__ = ["build_parser", "main", "to_text"]

_PROG = "flowspark"


class CliError(Exception):
    """A problem to report on one line (exit code 1)."""


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the `flowspark` command.

    Returns:
        The parser.
    """
    from flowspark._args import IMPORT_HELP, RULES_HELP

    parser = argparse.ArgumentParser(prog=_PROG, description="Build, inspect and run flowspark dataflows.")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a dataflow (in memory, or on Spark)", description="Run a dataflow.")
    run.add_argument("import_str", metavar="IMPORT_STR", help=IMPORT_HELP)
    run.add_argument(
        "--runtime",
        choices=["local", "spark"],
        help="local: the in-memory executor (default); spark: Apache Spark",
    )
    run.add_argument(
        "-w",
        "--workers-per-process",
        type=positive_int,
        metavar="N",
        help="in memory: N workers in this process, with Bytewax's assignment of partitions and keys "
        "(default 1); with --runtime spark: master local[N]",
    )
    run.add_argument("--master", metavar="URL", help="Spark master (default local[*]); implies --runtime spark")
    run.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run through a Spark Connect server (e.g. sc://localhost:15002); implies --runtime spark",
    )
    run.add_argument("--checkpoint", metavar="DIR", help="streaming checkpoint directory (Spark streaming)")
    run.add_argument(
        "--trigger",
        type=trigger_arg,
        metavar="T",
        help="streaming trigger: available_now (process what is there, then stop) or 'N seconds'",
    )
    run.add_argument(
        "--conf",
        type=conf_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark setting (repeatable)",
    )
    run.add_argument(
        "--buckets",
        type=positive_int,
        metavar="B",
        help="streaming: state buckets (fixed for a checkpoint's lifetime; default the checkpoint's, for a new one "
        "8 per shuffle partition, at least 16, in the chunk and key layouts, 64 in the bucket layout)",
    )
    run.add_argument(
        "--state-layout",
        choices=["chunk", "bucket", "key"],
        help="streaming: state layout: chunk (hot keys per bucket, the others in rows of many keys: cost follows "
        "the keys touched), bucket (one state row per bucket, for small state) or key (one row per cold key); "
        "default the checkpoint's, chunk for a new one",
    )
    run.add_argument(
        "--state-ttl",
        type=ttl_seconds,
        metavar="SECS",
        help="drop a stateful step's state for a key that got no value for SECS seconds (processing time)",
    )
    run.add_argument(
        "--dead-letter",
        metavar="PATH",
        help="send items a step cannot take (a failing stateless callable, a non-str key, a row that does not "
        "fit a SparkSink's schema) to this directory instead of stopping, one batch_id=N folder per batch",
    )
    run.add_argument(
        "--dead-letter-format",
        choices=["parquet", "json"],
        default="parquet",
        help="format of the --dead-letter directory (default parquet)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        metavar="SECS",
        help="streaming: stop after SECS seconds, between micro-batches (default: run until stopped)",
    )
    run.add_argument(
        "--clear-outputs",
        action="store_true",
        help="streaming: delete a file SparkSink's directory that holds another query's output (a new checkpoint "
        "on an old output) instead of refusing to run",
    )
    run.add_argument("--no-progress", action="store_true", help="do not print progress lines on stderr")
    run.add_argument(
        "--explain", action="store_true", help="print the Spark plan, with every rule's decision, before running"
    )
    run.add_argument("--rules", metavar="RULES", help=RULES_HELP)
    run.add_argument(
        "--float-reductions",
        action="store_true",
        help="batch flows: let sums, maxima and minima of float columns run as Spark aggregates "
        "(a float sum may then differ from Python's in the last digits; see docs/spark.md)",
    )

    plan = sub.add_parser("plan", help="print a dataflow's graph or its Spark plan", description="Print a plan.")
    plan.add_argument("import_str", metavar="IMPORT_STR", help=IMPORT_HELP)
    plan.add_argument("--format", choices=["text", "mermaid", "json"], default="text", help="output format")
    plan.add_argument("-r", "--recursive", action="store_true", help="show the core steps inside composite operators")
    plan.add_argument(
        "--spark",
        action="store_true",
        help="also compile for Spark: stages, fused steps, what each lowers to, and Spark's physical plan",
    )
    plan.add_argument(
        "--no-physical", action="store_true", help="with --spark: skip Spark's physical plan (needs no session)"
    )
    plan.add_argument("--master", default="local[1]", metavar="URL", help="Spark master for the physical plan")
    plan.add_argument(
        "--buckets",
        type=positive_int,
        metavar="B",
        help="streaming flows: state buckets (default a new checkpoint's: 8 per shuffle partition, at least 16, "
        "in the chunk and key layouts, 64 in the bucket layout)",
    )
    plan.add_argument(
        "--state-layout",
        choices=["chunk", "bucket", "key"],
        help="streaming flows: state layout (default a new checkpoint's: chunk; bucket on Spark 3.5)",
    )
    plan.add_argument("--rules", metavar="RULES", help=RULES_HELP)

    from flowspark.submit import add_submit_arguments

    submit = sub.add_parser(
        "submit",
        help="package a dataflow and run it on a Spark cluster with spark-submit",
        description="Package the dataflow's module or project, write a driver and run pyspark's spark-submit.",
    )
    submit.add_argument("import_str", metavar="IMPORT_STR", help=IMPORT_HELP)
    add_submit_arguments(submit)

    state = sub.add_parser(
        "state",
        help="print the per-key state of a streaming checkpoint",
        description="Read a streaming checkpoint's state with Spark's statestore reader; print each key's snapshot.",
    )
    state.add_argument("checkpoint", metavar="CHECKPOINT", help="the --checkpoint DIR of a streaming run")
    state.add_argument("--step", metavar="STEP_ID", help="only this stateful step (full id, or the operator's id)")
    state.add_argument("--key", metavar="KEY", help="only this key")
    state.add_argument("--batch-id", type=int, metavar="N", help="state as of micro-batch N (default: the last)")
    state.add_argument("--format", choices=["text", "json"], default="text", help="output format")
    state.add_argument("--master", default="local[1]", metavar="URL", help="Spark master used to read the state")
    return parser


# -- plan -----------------------------------------------------------------------------------------


def to_text(flow: Any, recursive: bool = False) -> str:
    """Describe a dataflow's steps and where each one's input comes from, as indented text.

    Args:
        flow: The dataflow.
        recursive: Show the core steps inside composite operators.

    Returns:
        The text.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> print(to_text(flow))
        dataflow 'eg': 3 steps
          eg.inp (input)
          eg.double (map) <- eg.inp
          eg.out (output) <- eg.double
    """
    from flowspark.visualize import RenderModel

    model = RenderModel(flow, recursive)
    src = {e.stream_id: (e.src, e.port) for e in model.edges}
    lines = [f"dataflow {model.flow_id!r}: {len(model.steps)} steps"]

    def origin(stream: str) -> str:
        found = src.get(stream)
        if found is None:
            return stream
        step, port = found
        return step if port == "down" else f"{step}.{port}"

    def emit(step: Any, depth: int) -> None:
        pad = "  " * depth
        core = f", core {step.core}" if recursive and step.core and step.core != step.op else ""
        ups = [origin(u) for u in step.ups]
        frm = f" <- {', '.join(ups)}" if ups else ""
        lines.append(f"{pad}{step.step_id} ({step.op}{core}){frm}")
        for s in step.substeps:
            emit(s, depth + 1)

    for step in model.steps:
        emit(step, 1)
    return "\n".join(lines)


def _plan_json(plan: Any, describe: Any) -> dict[str, Any]:
    return {
        "stages": [
            {
                "stage": st.spec.stage_id,
                "kind": st.kind,
                "lowers_to": describe(st),
                "steps": list(st.steps),
                "inputs": [f"stage{s}.port{p}" for s, p, _ in st.inputs],
                "ports": [{"stream": p.stream, "keyed_for": p.key_for} for p in st.spec.ports],
            }
            for st in plan.stages
        ],
        "sinks": [
            {"step_id": sk.step_id, "sink": type(sk.sink).__name__, "where": sk.where, "from": list(sk.port)}
            for sk in plan.sinks
        ],
        "inspects": [{"step_id": i.step_id, "from": list(i.port)} for i in plan.inspects],
    }


def _state_layout(plan: Any, streaming: Any, partitions: Optional[int]) -> list[dict[str, Any]]:
    """How each keyed stage partitions its keys and keeps their state, in the lowering's own words."""
    from flowspark.spark.batch.describe import describe_keyed_state, describe_stage

    out = []
    for st in plan.stages:
        if st.kind != "keyed":
            continue
        entry: dict[str, Any] = {"stage": st.spec.stage_id, "steps": [ks.step_id for ks in st.spec.chain]}
        if streaming is not None:
            entry.update(buckets=streaming.buckets, lowers_to=streaming.stage(st), state=streaming.state(st))
        else:
            entry.update(partitions=partitions, lowers_to=describe_stage(st), state=describe_keyed_state(st))
        out.append(entry)
    return out


def _plan_layout(asked: Optional[str]) -> tuple[str, Optional[str]]:
    """The layout `plan --spark` describes (`--state-layout`, else a new checkpoint's here), and why not the default."""
    from flowspark.spark.streaming.lowering import layout_note, layouts_here
    from flowspark.spark.streaming.state import LAYOUTS

    if asked is not None:
        return asked, None
    chosen = layouts_here(LAYOUTS)[0]
    return chosen, layout_note(chosen, LAYOUTS[0])


def _cmd_plan(args: argparse.Namespace) -> int:
    from flowspark.visualize import to_flowchart, to_steps_json

    flow = _load(args.import_str)
    if not args.spark:
        if args.format == "json":
            print(to_steps_json(flow, args.recursive))
        elif args.format == "mermaid":
            print(to_flowchart(flow, args.recursive))
        else:
            print(to_text(flow, args.recursive))
        return 0
    if args.format == "mermaid":
        msg = "--spark prints the Spark plan as text or json; use --format text or --format json"
        raise CliError(msg)
    _need_pyspark("plan --spark")
    from flowspark.spark.batch.describe import describe_stage
    from flowspark.spark.plan.compiler import compile_flow
    from flowspark.spark.rules.lowerings import runs_as_batch
    from flowspark.spark.rules.optimizer import Env, optimize
    from flowspark.spark.rules.switches import rules_arg
    from flowspark.spark.streaming import Lowering, compile_streaming, needs_timers
    from flowspark.spark.streaming.checkpoint import untimed_choice

    plan = compile_flow(flow.validate())
    chosen = rules_arg(args.rules, "--rules")
    # As `flowspark run --runtime spark` runs it: --buckets / --state-layout ask for the streaming query.
    batch = runs_as_batch(plan, _asks_stream(args), chosen[0])
    streaming = None
    layout_name, layout_why = _plan_layout(args.state_layout)
    if not batch:
        compile_streaming(plan)  # the checks of the streaming lowering
    physical: list[tuple[int, str]] = []
    partitions: Optional[int] = None
    buckets = args.buckets
    if buckets is None:  # a new checkpoint's, in the session `flowspark run` opens here
        from flowspark.spark.session import DEFAULT_CONF
        from flowspark.spark.streaming.lowering import default_buckets

        buckets = default_buckets(layout_name, int(DEFAULT_CONF["spark.sql.shuffle.partitions"]))
    if args.no_physical:
        from flowspark.spark.streaming.lowering import offline_env

        env = Env("batch", chosen[0], chosen[1], session=False) if batch else offline_env(plan, chosen)
        plan = optimize(plan, env)
    else:
        from flowspark.spark.session import open_session
        from flowspark.spark.tools import physical_plans, streaming_physical_plans

        shuffle = {"spark.sql.shuffle.partitions": "2"}
        spark = open_session(args.master, shuffle, app_name="flowspark plan", new_conf=_jars_conf(flow))
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
        if batch:
            plan, physical = physical_plans(plan, spark, rules=args.rules)
        else:
            plan, physical = streaming_physical_plans(flow, spark, buckets, rules=args.rules, layout=layout_name)
    if not batch:
        timers = needs_timers(plan)
        # a new checkpoint's choice without state_ttl; the text says what a state_ttl changes
        untimed = untimed_choice(layout_name, timers, ttl=False)
        streaming = Lowering(plan, buckets, timers, layout_name, untimed)
    describe = describe_stage if streaming is None else streaming.stage
    layout = _state_layout(plan, streaming, partitions)
    if args.format == "json":
        doc = {"dataflow": json.loads(to_steps_json(flow, args.recursive)), "spark": _plan_json(plan, describe)}
        doc["spark"]["mode"] = "streaming" if streaming else "batch"
        doc["spark"]["keyed_state"] = layout
        if streaming is not None and layout_why is not None:
            doc["spark"]["state_layout_note"] = layout_why
        if not args.no_physical:
            doc["spark"]["physical"] = {str(sid): text for sid, text in physical}
        print(json.dumps(doc, indent=2))
        return 0
    print(to_text(flow, args.recursive))
    print()
    print(plan.render(describe))
    print()
    if streaming is not None:
        mode = "a Structured Streaming query (an unbounded source)"
    elif plan.bounded:
        mode = "Spark batch jobs (bounded input)"
    else:
        mode = "Spark batch jobs reading each partition to its end (rule drain_sources; with --checkpoint: a stream)"
    print(f"runs as {mode}")
    if streaming is not None and layout_why is not None:
        print(layout_why)
    for ks in layout:
        print(f"keyed stage {ks['stage']}: {ks['lowers_to']}")
        print(f"    state: {ks['state']}")
    for sid, text in physical:
        print()
        print(f"== stage {sid}: Spark physical plan ==")
        print(text)
    return 0


# -- run ------------------------------------------------------------------------------------------


def _need_pyspark(what: str) -> None:
    import importlib.util

    try:
        found = importlib.util.find_spec("pyspark") is not None and sys.modules.get("pyspark", True) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        msg = f"`flowspark {what}` needs pyspark; install it with `pip install 'flowspark[spark]'`"
        raise CliError(msg)


def _load(import_str: str) -> Any:
    from flowspark._importstr import locate_dataflow

    flow = locate_dataflow(import_str)
    flow.validate()
    return flow


def _unbounded_inputs(flow: Any) -> list[str]:
    from flowspark import ir

    out = []
    for node in flow.graph().nodes:
        if isinstance(node, ir.Input):
            bounded = getattr(node.source, "is_bounded", lambda: False)()
            if not bounded:
                out.append(node.step_id)
    return out


def _asks_stream(args: argparse.Namespace) -> Optional[str]:
    """`plan --spark`: a flag of streaming queries only (a stand-in for a checkpoint), or `None`."""
    return "--buckets/--state-layout" if args.buckets is not None or args.state_layout is not None else None


def _streams(flow: Any, args: argparse.Namespace, unbounded: list[str]) -> bool:
    """Whether `flowspark run --runtime spark` runs a streaming query.

    It does with a streaming flag, or a source a batch job cannot read to its end (without
    --checkpoint the rule `drain_sources` decides).
    """
    from flowspark.spark.plan.compiler import compile_flow
    from flowspark.spark.rules.lowerings import runs_as_batch
    from flowspark.spark.rules.switches import rules_arg

    flags: tuple[Any, ...] = (args.checkpoint, args.trigger, args.timeout, args.buckets, args.state_layout)
    if any(f is not None for f in flags) or args.clear_outputs:
        return True
    return bool(unbounded) and not runs_as_batch(compile_flow(flow), None, rules_arg(args.rules, "--rules")[0])


def _cmd_run(args: argparse.Namespace) -> int:
    spark_only = [
        f"--{name.replace('_', '-')}"
        for name in ("master", "remote", "checkpoint", "trigger", "timeout", "buckets", "state_layout", "rules")
        if getattr(args, name) is not None
    ] + [flag for flag, on in (("--conf", args.conf), ("--clear-outputs", args.clear_outputs)) if on]
    runtime = args.runtime or ("spark" if spark_only else "local")
    if args.master is not None and args.remote is not None:
        msg = "--master and --remote: give one (--remote runs through a Spark Connect server, which has its own master)"
        raise CliError(msg)
    if runtime == "local" and spark_only:
        msg = f"{', '.join(spark_only)}: only for --runtime spark; drop them or use --runtime spark"
        raise CliError(msg)
    workers = args.workers_per_process
    if workers is not None and runtime == "spark":
        if args.master is not None or args.remote is not None:
            other = "--master" if args.remote is None else "--remote"
            msg = f"-w {workers} and {other}: give one (on Spark, -w N means --master local[N])"
            raise CliError(msg)
        args.master = f"local[{workers}]"
    flow = _load(args.import_str)
    if runtime == "local":
        from flowspark.runtime.workers import run_workers

        run_workers("flowspark run", flow, workers or 1, state_ttl=args.state_ttl, dead_letter=_dead_letter(args))
        return 0
    _need_pyspark("run --runtime spark")
    from flowspark.spark.rules.switches import rules_arg

    rules_arg(args.rules, "--rules")  # a bad value before a session starts
    conf = dict(args.conf)
    unbounded = _unbounded_inputs(flow)
    if _streams(flow, args, unbounded):
        if args.float_reductions:
            msg = (
                "--float-reductions applies to batch runs (every source bounded); this run is a streaming "
                "query, whose reductions emit nothing until end of input: drop --float-reductions"
            )
            raise CliError(msg)
        return _run_streaming(flow, args, conf, unbounded)
    from flowspark.spark import compile_flow, run
    from flowspark.spark.tools import Progress

    compile_flow(flow)  # compile errors before starting a session
    spark = _open_run_session(flow, args, conf)
    options = {
        "state_ttl": args.state_ttl,
        "dead_letter": _dead_letter(args),
        "explain": args.explain,
        "rules": args.rules,
        "float_reductions": args.float_reductions,
    }
    if args.no_progress:
        _interruptible(lambda: run(flow, spark=spark, **options))
    else:
        with Progress(spark):
            _interruptible(lambda: run(flow, spark=spark, **options))
    return 0


def _interruptible(fn: Any) -> Any:
    """Call `fn`; after Ctrl-C, whatever error the cancelled Spark job gives is `KeyboardInterrupt`.

    pyspark's own SIGINT handler cancels the running jobs (a source that never ends stops
    there); the job's error that follows is not the user's. That handler runs in a thread of
    its own (`_off_main_thread`): called in the main thread, it sends `cancelAllJobs` over
    the py4j connection the main thread is blocked on (the job's `collect`), which py4j can
    refuse ("reentrant call"), leaving the job running and the process waiting for it.
    """
    import signal

    got: list[int] = []
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: Any) -> None:
        got.append(signum)
        if callable(previous):
            _off_main_thread(previous, signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        return fn()
    except Exception:
        if got:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


def _off_main_thread(handler: Callable[[int, Any], Any], signum: int, frame: Any) -> threading.Thread:
    """Run a chained signal handler in a daemon thread (its own py4j connection); its `KeyboardInterrupt` is dropped."""

    def call() -> None:
        with contextlib.suppress(KeyboardInterrupt):
            handler(signum, frame)

    thread = threading.Thread(target=call, name="flowspark-sigint", daemon=True)
    thread.start()
    return thread


def _open_run_session(flow: Any, args: argparse.Namespace, conf: dict[str, str]) -> Any:
    """The session `flowspark run` runs `flow` in: `--master` or `--remote`, with Kafka's or Delta's jars if needed."""
    from flowspark.spark.session import open_session

    return open_session(
        args.master or "local[*]",
        conf,
        app_name=f"flowspark {flow.flow_id}",
        remote=args.remote,
        new_conf=_jars_conf(flow),
    )


def _jars_conf(flow: Any) -> Callable[[], dict[str, str]]:
    """What a session the CLI creates for `flow` needs before it starts (Kafka's or Delta's jars, Delta's settings)."""

    def new_conf() -> dict[str, str]:
        from flowspark.spark import compile_flow
        from flowspark.spark.io.classpath import session_conf

        return session_conf(compile_flow(flow))

    return new_conf


def _dead_letter(args: argparse.Namespace) -> Any:
    """The `--dead-letter` directory as a `DeadLetterDir` (absolute path), or `None`."""
    if args.dead_letter is None:
        return None
    from flowspark.deadletter import DeadLetterDir

    return DeadLetterDir(str(Path(args.dead_letter).resolve()), format=args.dead_letter_format)


def _run_streaming(flow: Any, args: argparse.Namespace, conf: dict[str, str], unbounded: list[str]) -> int:
    """Run `flow` with the Spark streaming runtime (`flowspark.spark.streaming.run_streaming`).

    Prints Spark's per-micro-batch progress line on stderr (unless `--no-progress`).

    Args:
        flow: The dataflow.
        args: Parsed `flowspark run` arguments (`master`, `checkpoint`, `trigger`, `no_progress`, `explain`).
        conf: Spark settings.
        unbounded: Step ids of the flow's unbounded inputs.

    Returns:
        The exit code.

    Raises:
        CliError: `--checkpoint` is missing for an unbounded flow, or
            `--checkpoint`/`--trigger` were given for a bounded one.
        RecoveryError: The checkpoint was written by another flow, bucket count or
            state layout (checked before a SparkSession starts).
    """
    if not unbounded:
        msg = (
            "--checkpoint/--trigger/--timeout/--buckets/--state-layout/--clear-outputs apply to flows with an "
            "unbounded source; "
            "every source "
            "of this flow is bounded, so it runs as a Spark batch job: drop them"
        )
        raise CliError(msg)
    if args.checkpoint is None:
        msg = (
            f"source(s) {', '.join(map(repr, unbounded))} are unbounded, so the flow runs as a streaming query "
            "and needs --checkpoint DIR (where its offsets and state live)"
        )
        raise CliError(msg)
    trigger = None
    if args.trigger is not None:
        kind, secs = parse_trigger(args.trigger)
        trigger = "available_now" if kind == "available_now" else f"{round((secs or 0) * 1000)} milliseconds"
    from flowspark._paths import is_local
    from flowspark.spark.api import check_streaming
    from flowspark.spark.streaming import run_streaming as _run

    plain = is_local(args.checkpoint, ("",))  # a path, not a URI
    checkpoint = str(Path(args.checkpoint).resolve()) if plain else args.checkpoint
    check_streaming(
        flow, checkpoint, args.buckets, args.state_layout, args.state_ttl is not None
    )  # before a session starts
    spark = _open_run_session(flow, args, conf)
    progress: Any = False if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    _run(
        flow,
        spark=spark,
        checkpoint=checkpoint,
        trigger=trigger,
        progress=progress,
        explain=args.explain,
        timeout=args.timeout,
        state_layout=args.state_layout,
        state_ttl=args.state_ttl,
        dead_letter=_dead_letter(args),
        clear_outputs=args.clear_outputs,
        rules=args.rules,
        **({"buckets": args.buckets} if args.buckets is not None else {}),
    )
    return 0


# -- main -----------------------------------------------------------------------------------------


def _error_line(err: BaseException) -> Optional[str]:
    """The one line to print for an error the CLI reports without a traceback, or None."""
    from flowspark.errors import FlowsparkError

    if isinstance(err, (CliError, FlowsparkError)):
        return _one_line(err)
    mod = type(err).__module__ or ""
    if mod.startswith(("py4j", "pyspark")):
        from flowspark.spark.tools import spark_error_line

        return spark_error_line(err)
    return None


def main(argv: Optional[list[str]] = None) -> int:
    """Run the `flowspark` command line.

    Args:
        argv: Arguments (default: `sys.argv[1:]`).

    Returns:
        The exit code: 0 on success, 1 for an error, 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"run": _cmd_run, "plan": _cmd_plan, "submit": _cmd_submit, "state": _cmd_state}
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        line = _error_line(e)
        if line is None or args.traceback:
            if line is not None:
                traceback.print_exc()
                return 1
            raise
        print(f"{_PROG}: error: {line}", file=sys.stderr)
        return 1


def _pick_steps(steps: list[str], want: Optional[str], checkpoint: str) -> list[int]:
    if want is None:
        return list(range(len(steps)))
    for rule in (lambda s: s == want, lambda s: s.startswith(want + "."), lambda s: ("." + want + ".") in f".{s}."):
        hits = [i for i, s in enumerate(steps) if rule(s)]
        if len(hits) == 1:
            return hits
    msg = f"checkpoint {checkpoint!r} has no single stateful step {want!r}; its stateful steps are {', '.join(steps)}"
    raise CliError(msg)


def _cmd_state(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flowspark._paths import is_local
    from flowspark.spark.streaming.checkpoint import LEGACY_LAYOUT

    local = is_local(args.checkpoint) and not args.checkpoint.startswith("file:")  # Path() cannot open file: URIs
    if local and not Path(args.checkpoint, "flowspark.json").is_file():
        # Checked before a Spark session starts (a URI is checked by read_state, through Spark).
        what = "does not exist" if not Path(args.checkpoint).exists() else "has no flowspark.json"
        msg = (
            f"{args.checkpoint!r} {what}, so it is not a flowspark streaming checkpoint; give the --checkpoint DIR "
            "of a `flowspark run` streaming run"
        )
        raise CliError(msg)
    if local:  # a bad --step is refused before a Spark session starts
        _pick_steps(
            json.loads(Path(args.checkpoint, "flowspark.json").read_text()).get("stateful_steps") or [],
            args.step,
            args.checkpoint,
        )
    _need_pyspark("state")
    from flowspark.spark.session import open_session
    from flowspark.spark.tools import need_state_reader, read_state

    need_state_reader(args.checkpoint)  # before a Spark session starts
    spark = open_session(args.master, {"spark.sql.shuffle.partitions": "1"}, app_name="flowspark state")
    sizes: dict[str, int] = {}
    meta, table = read_state(spark, args.checkpoint, args.batch_id, sizes)
    waiting = sum(1 for ent in table.values() if ent[1] is not None)
    steps = list(meta.get("stateful_steps") or [])
    picked = _pick_steps(steps, args.step, args.checkpoint)
    keys = sorted(table) if args.key is None else [k for k in (args.key,) if k in table]
    records = []
    for key in keys:
        snaps, notify_at = table[key][:2]  # (snapshots, notify_at[, run]): see BucketDriver
        for i in picked:
            if snaps[i] is None:
                continue
            records.append((steps[i], key, snaps[i][0], notify_at))
    if args.format == "json":
        doc = {
            "flow_id": meta.get("flow_id"),
            "buckets": meta.get("buckets"),
            "state_layout": meta.get("state_layout", LEGACY_LAYOUT),
            "stateful_steps": steps,
            "keys": len(table),
            "waiting_for_notification": waiting,
            "state_bytes": sizes.get("bytes", 0),
            "state": [
                {
                    "step_id": step,
                    "key": key,
                    "snapshot": _jsonable(snap),
                    "notify_at": at.isoformat() if at is not None else None,
                }
                for step, key, snap, at in records
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"checkpoint {args.checkpoint}: dataflow {meta.get('flow_id')!r}, {meta.get('buckets')} buckets "
        f"(layout {meta.get('state_layout', LEGACY_LAYOUT)!r}), {len(table)} keys with state, {waiting} waiting "
        f"for a notification, {sizes.get('bytes', 0):,} bytes of pickled state rows"
    )
    for step, key, snap, at in records:
        when = f"  (next notification {at.isoformat()})" if at is not None else ""
        print(f"{step} {key!r}: {snap!r}{when}")
    if args.key is not None and not keys:
        print(f"no state for key {args.key!r}")
    return 0


def _jsonable(x: Any) -> Any:
    try:
        json.dumps(x)
    except (TypeError, ValueError):
        return repr(x)
    return x


def _cmd_submit(args: argparse.Namespace) -> int:
    from flowspark.submit import submit

    return submit(args)


if __name__ == "__main__":
    sys.exit(main())
