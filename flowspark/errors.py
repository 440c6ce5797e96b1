"""Errors raised by flowspark.

Every error a user can see derives from `FlowsparkError`. Errors about bad
input are also `ValueError` or `TypeError`, and the errors Bytewax raises
have a flowspark class that is also the Bytewax one's built-in base, so code
written for Bytewax that catches those keeps working.

```
FlowsparkError
├── FlowsparkBuildError          (+ ValueError)  the dataflow is malformed
│   ├── DuplicateStepError                      a step id is used twice
│   ├── IncompleteDataflowError  (+ FlowsparkRuntimeError) no input, or no output/inspect step
│   │                                             (`run_main` raises a plain FlowsparkRuntimeError
│   │                                             caused by it, as Bytewax does)
│   └── StreamScopeError         (+ AssertionError) a stream not passed to the enclosing operator
├── MissingPathError             (+ ValueError, FileNotFoundError)   a source's path does not exist
├── NotADirectoryPathError       (+ ValueError, NotADirectoryError)  DirSource given a file
├── FlowsparkTypeError           (+ TypeError)   an argument of the wrong type
├── FlowsparkCompileError        (+ ValueError)  a runtime cannot run this flow
├── FlowsparkRuntimeError        (+ RuntimeError) a user callable failed while running, or
│   │                                             returned what its step cannot use; names
│   │                                             the step, chains the cause
│   │                                             (alias: BytewaxRuntimeError)
│   └── FlowsparkRuntimeTypeError (+ TypeError)  an item before a stateful step is not a
│                                                 `(str key, value)` 2-tuple (`routing_error`)
│                                                 (`resumed_error`: the same classes, for a key
│                                                 resumed from an earlier run's snapshot)
├── RecoveryError                (+ ValueError)  recovery store missing or inconsistent
│   ├── NoPartitionsError        (+ FileNotFoundError)
│   ├── MissingPartitionsError   (+ FileNotFoundError)
│   └── InconsistentPartitionsError
├── SingleProcessError           (+ ValueError)  a cluster of several processes asked of the in-memory
│                                                 executor (alias: SingleWorkerError)
├── WorkerEnvironmentError       (+ RuntimeError) Spark's Python workers cannot run flowspark
└── ImportStrError               (+ ValueError)  a CLI import string did not resolve
```

Runtimes wrap an exception raised inside a step with `step_error`. As in
Bytewax, whose `BytewaxRuntimeError` is not a `TypeError` or `ValueError`, the
error is a `FlowsparkRuntimeError` whatever the user's exception was (it is the
`__cause__`), including flowspark's checks of what a user callable returned (a
predicate that returns a non-`bool`, a key function a non-`str`). The one
exception is the routing check before a stateful step (a non-`str` key, an item
that is not a 2-tuple), for which Bytewax raises a bare `TypeError`: there the
error is a `FlowsparkRuntimeTypeError`, so a ported `pytest.raises(TypeError)`
catches it.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "BytewaxRuntimeError",
    "DuplicateStepError",
    "FlowsparkBuildError",
    "FlowsparkCompileError",
    "FlowsparkError",
    "FlowsparkRuntimeError",
    "FlowsparkRuntimeTypeError",
    "FlowsparkTypeError",
    "ImportStrError",
    "InconsistentPartitionsError",
    "IncompleteDataflowError",
    "MissingPartitionsError",
    "NoPartitionsError",
    "MissingPathError",
    "NotADirectoryPathError",
    "RecoveryError",
    "SingleProcessError",
    "SingleWorkerError",
    "StreamScopeError",
    "WorkerEnvironmentError",
    "malformed_input_error",
    "malformed_input_text",
    "resumed_error",
    "routing_error",
    "step_error",
]


class FlowsparkError(Exception):
    """Base class of every flowspark error."""


class FlowsparkBuildError(FlowsparkError, ValueError):
    """The dataflow is malformed (bad step id, missing input or output...)."""


class DuplicateStepError(FlowsparkBuildError):
    """A step id is used twice within the same parent."""


class FlowsparkTypeError(FlowsparkError, TypeError):
    """An argument or item has the wrong type."""


class FlowsparkCompileError(FlowsparkError, ValueError):
    """A runtime cannot run this dataflow (unsupported step, unpicklable callable)."""


class FlowsparkRuntimeError(FlowsparkError, RuntimeError):
    """A user callable failed while the dataflow ran.

    Every runtime words it the same way (`step_error`):
    `error in step 'flow.step' for key 'k': KeyError: 'user'`.
    `flowspark.errors.BytewaxRuntimeError` is this class, so a test ported from
    Bytewax that catches `BytewaxRuntimeError` catches it.

    Attributes:
        step_id: The fully qualified id of the step that failed.
        key: The key whose logic failed (stateful steps), else `None`.
        exc_type: Name of the original exception's type.
        exc_message: The original exception's message.
    """

    def __init__(
        self,
        step_id: str,
        message: str,
        key: Optional[str] = None,
        exc_type: Optional[str] = None,
        exc_message: Optional[str] = None,
        item: Optional[str] = None,
    ) -> None:
        """Create the error.

        Args:
            step_id: Fully qualified step id.
            message: What happened.
            key: The key being processed, if any.
            exc_type: Name of the original exception's type.
            exc_message: The original exception's message.
            item: `repr` of the item the step failed on (shortened), when known.
        """
        super().__init__(message)
        self.step_id = step_id
        self.key = key
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.item = item

    @classmethod
    def describe(
        cls,
        step_id: str,
        exc_type: str,
        exc_message: str,
        key: Optional[str] = None,
        item: Optional[str] = None,
    ) -> FlowsparkRuntimeError:
        """Build the error from its parts (the one wording every runtime uses).

        Args:
            step_id: Fully qualified step id.
            exc_type: Name of the original exception's type.
            exc_message: The original exception's message.
            key: The key being processed, if any.
            item: `repr` of the item the step failed on, if known.

        Returns:
            The error (no cause attached).
        """
        where = f"step {step_id!r}" if key is None else f"step {step_id!r} for key {key!r}"
        on = "" if item is None else f" (item: {item})"
        return cls(step_id, f"error in {where}: {exc_type}: {exc_message}{on}", key, exc_type, exc_message, item)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with every constructor argument (errors cross process boundaries on Spark)."""
        args = (self.step_id, str(self), self.key, self.exc_type, self.exc_message, self.item)
        return (type(self), args, self.__dict__)


BytewaxRuntimeError = FlowsparkRuntimeError
"""What `bytewax.errors.BytewaxRuntimeError` is in flowspark: the error a failing step raises."""


class FlowsparkRuntimeTypeError(FlowsparkRuntimeError, TypeError):
    """An item before a stateful step is not a `(str key, value)` 2-tuple.

    Bytewax raises a bare `TypeError` for this routing check of its stateful
    steps, and only for it (a `TypeError` raised by user code, or by Bytewax's
    checks of what a user callable returned, reaches the caller as the cause of a
    `BytewaxRuntimeError`, which is not a `TypeError`). This error is both a
    `FlowsparkRuntimeError` (it names the step and chains the `KeyRoutingError`
    that says what was wrong) and a `TypeError`, so a ported
    `pytest.raises(TypeError)` catches it. Made by `routing_error`, and by
    nothing else: an error raised by user code is a plain `FlowsparkRuntimeError`
    whatever its type (`step_error`).

    The class was public before it had this one use, when every `TypeError` in
    a step gave it; it is kept (not aliased to `FlowsparkRuntimeError`) because
    it is what a routing check raises, and `except FlowsparkRuntimeTypeError` in
    existing code keeps catching exactly that check.
    """


class IncompleteDataflowError(FlowsparkBuildError, FlowsparkRuntimeError):
    """The dataflow has no input step, or no output or inspect step.

    Bytewax detects this when the flow starts running and raises a
    `BytewaxRuntimeError` caused by a `ValueError` ("... needs to contain at
    least one input step ..."). flowspark detects it in `Dataflow.validate()`,
    which every runtime calls before it starts; this error is a `ValueError` as
    well as a `FlowsparkRuntimeError`. `run_main` and `cluster_main` raise it as
    Bytewax does: a `FlowsparkRuntimeError` (`BytewaxRuntimeError`, not a
    `ValueError`) whose `__cause__` is this error, so a ported test's
    `pytest.raises(RuntimeError)` around `pytest.raises(ValueError)` passes.

    Attributes:
        step_id: The dataflow's id.
    """


class StreamScopeError(FlowsparkBuildError, AssertionError):
    """An operator was given a stream that its enclosing operator was not passed.

    Inside a custom operator, only the streams passed to it as `Stream`
    arguments (or in its `*ups`) and the streams its own steps produce may be
    used. A stream nested in a list or dict argument, or captured from outside,
    is not. Bytewax raises an `AssertionError` ("inconsistent stream
    scoping"); this error is one too, and a `ValueError`.
    """


class MissingPathError(FlowsparkError, ValueError, FileNotFoundError):
    """A source's file or directory does not exist.

    Bytewax raises a `ValueError`; this error is one, and also the
    `FileNotFoundError` flowspark raised before, so either `except` works.
    """


class NotADirectoryPathError(FlowsparkError, ValueError, NotADirectoryError):
    """`DirSource` was given a path that is not a directory (a `ValueError` and a `NotADirectoryError`)."""


class RecoveryError(FlowsparkError, ValueError):
    """The recovery store is missing, incomplete or inconsistent."""


class NoPartitionsError(RecoveryError, FileNotFoundError):
    """The recovery directory holds no partitions (also a `FileNotFoundError`, as in Bytewax)."""


class MissingPartitionsError(RecoveryError, FileNotFoundError):
    """Some recovery partitions are missing (also a `FileNotFoundError`, as in Bytewax)."""


class InconsistentPartitionsError(RecoveryError):
    """Recovery partitions disagree with each other."""


class SingleProcessError(FlowsparkError, ValueError):
    """A cluster of several processes was asked of the in-memory executor, which runs its workers in one.

    Raised by `flowspark.testing.cluster_main` and `flowspark.run.cli_main` for more
    than one address (a process of a multi-process cluster). N workers in this process
    run: `worker_count_per_proc=N`, `-w N`. A cluster of machines is Spark's:
    `flowspark submit IMPORT_STR --master spark://HOST:PORT`.
    """


#: The name of `SingleProcessError` while the in-memory executor ran a single worker.
SingleWorkerError = SingleProcessError


class WorkerEnvironmentError(FlowsparkError, RuntimeError):
    """The Python workers of a SparkSession cannot import flowspark or what it needs.

    Raised before any job runs, with one line saying which interpreter the workers run,
    what is missing and what to set (usually `PYSPARK_PYTHON`).
    """


class ImportStrError(FlowsparkError, ValueError):
    """An import string given on the command line did not resolve to a Dataflow."""


_NO_ITEM: Any = object()


def short_repr(x: Any, limit: int = 200) -> str:
    """`repr(x)`, shortened to `limit` characters (for error messages).

    Args:
        x: Anything.
        limit: Most characters kept.

    Returns:
        The text.
    """
    try:
        text = repr(x)
    except Exception as e:  # noqa: BLE001
        text = f"<{type(x).__name__} whose repr() raised {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def step_error(
    step_id: str,
    exc: BaseException,
    message: Optional[str] = None,
    key: Optional[str] = None,
    item: Any = _NO_ITEM,
) -> FlowsparkRuntimeError:
    """Wrap an exception raised inside a step into the error every runtime raises.

    Every runtime wraps a failure of a step with this one function, so the
    class and the message are the same everywhere: a `FlowsparkRuntimeError`
    (a `RuntimeError`, never a `TypeError` or `ValueError`, as Bytewax's
    `BytewaxRuntimeError`) whatever `exc` is, even a `TypeError`; `exc` is
    chained as `__cause__`. An `exc` that already is a `FlowsparkRuntimeError`
    (wrapped by an inner step) is returned unchanged. (The routing check before a
    stateful step uses `routing_error`.)

    Args:
        step_id: Fully qualified id of the step that failed.
        exc: What the step raised.
        message: The error's message (default:
            `"error in step '<step_id>'[ for key '<key>']: <exception type>: <exception message>"`).
        key: The key whose logic failed (stateful steps).
        item: The item the step failed on, when known (its shortened `repr` is shown).

    Returns:
        The error to raise (`raise step_error(sid, e) from e`).

    Raises:
        FlowsparkTypeError: `step_id` is not a `str` or `exc` is not an exception.

    Example:
        >>> err = step_error("flow.add", TypeError("unsupported operand type(s) for +: 'int' and 'str'"))
        >>> isinstance(err, TypeError), isinstance(err, BytewaxRuntimeError), type(err.__cause__).__name__
        (False, True, 'TypeError')
        >>> str(err)
        "error in step 'flow.add': TypeError: unsupported operand type(s) for +: 'int' and 'str'"
        >>> str(step_error("f.count", KeyError("user"), key="ann"))
        "error in step 'f.count' for key 'ann': KeyError: 'user'"
        >>> str(step_error("f.key", KeyError("user"), item={"id": 7}))
        "error in step 'f.key': KeyError: 'user' (item: {'id': 7})"
        >>> type(step_error("flow.div", ZeroDivisionError("division by zero"))).__name__
        'FlowsparkRuntimeError'
    """
    return _wrap(FlowsparkRuntimeError, step_id, exc, message, key, item)


def routing_error(step_id: str, exc: FlowsparkTypeError) -> FlowsparkRuntimeError:
    """The error of a stateful step given an item it cannot route: not a 2-tuple, or a non-`str` key.

    Bytewax raises a bare `TypeError` for this check (and only for it); flowspark
    raises a `FlowsparkRuntimeTypeError`: a `TypeError` as in Bytewax, and a
    `FlowsparkRuntimeError` naming the step, worded as `step_error` words any error.

    Args:
        step_id: Fully qualified id of the stateful step.
        exc: What was wrong (`flowspark.runtime.driver.bad_item_error`), chained as `__cause__`.

    Returns:
        The error to raise.

    Example:
        >>> err = routing_error("f.sum", FlowsparkTypeError("keys must be str; received key 1"))
        >>> isinstance(err, TypeError), isinstance(err, BytewaxRuntimeError)
        (True, True)
        >>> str(err)
        "error in step 'f.sum': FlowsparkTypeError: keys must be str; received key 1"
    """
    return _wrap(FlowsparkRuntimeTypeError, step_id, exc, None, None, _NO_ITEM)


def _wrap(
    cls: type[FlowsparkRuntimeError],
    step_id: str,
    exc: BaseException,
    message: Optional[str],
    key: Optional[str],
    item: Any,
) -> FlowsparkRuntimeError:
    """`step_error` with the class given."""
    if not isinstance(step_id, str):
        msg = f"step_error: step_id must be a str; received {step_id!r} of type {type(step_id).__name__}"
        raise FlowsparkTypeError(msg)
    if not isinstance(exc, BaseException):
        msg = f"step_error: exc must be an exception; received {exc!r} of type {type(exc).__name__}"
        raise FlowsparkTypeError(msg)
    if isinstance(exc, FlowsparkRuntimeError):
        return exc
    shown = None if item is _NO_ITEM else short_repr(item)
    err = cls.describe(step_id, type(exc).__name__, str(exc), key, shown)
    if message is not None:
        err = cls(step_id, message, key, err.exc_type, err.exc_message, shown)
    err.__cause__ = exc
    return err


#: Characters of a malformed input row's raw text that its error message shows.
RAW_SHOWN = 200
#: The `exc_type` (and dead-letter `error_type`) of a row a source could not parse.
MALFORMED_INPUT = "MalformedInput"


def malformed_input_text(file: str, raw: str) -> str:
    """What is wrong with a row a source could not parse: its file and raw text (cut to `RAW_SHOWN` characters).

    Args:
        file: The file the row came from.
        raw: The row's raw text.

    Returns:
        The text.

    Example:
        >>> malformed_input_text("file:/data/p1.json", '{"user": "eve", "url": ')
        'malformed input row in file:/data/p1.json: {"user": "eve", "url": '
    """
    return f"malformed input row in {file}: {raw[:RAW_SHOWN]}"


def malformed_input_error(step_id: str, file: str, raw: str) -> FlowsparkRuntimeError:
    """The error that stops a run at a row its input step could not parse (no dead letter).

    Args:
        step_id: The input step.
        file: The file the row came from.
        raw: The row's raw text.

    Returns:
        The error: names the step, the file and the raw text, and says how to go on.

    Example:
        >>> err = malformed_input_error("f.inp", "file:/data/p1.json", "{bad")
        >>> err.step_id, err.exc_type, err.exc_message
        ('f.inp', 'MalformedInput', 'malformed input row in file:/data/p1.json: {bad')
    """
    what = malformed_input_text(file, raw)
    msg = (
        f"error in step {step_id!r}: {what}; fix or remove the row in the file, or run with a dead letter "
        "(dead_letter=DeadLetterDir(path), flowspark run --dead-letter PATH), which keeps such rows with their "
        "file and goes on"
    )
    return FlowsparkRuntimeError(step_id, msg, None, MALFORMED_INPUT, what)


def _type_name(x: Any) -> str:
    """`int` for builtins, `module.Qualname` for other types (for error messages)."""
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def resumed_error(
    step_id: str, exc: BaseException, key: str, snapshot: Any, store: str = "checkpoint or recovery directory"
) -> FlowsparkRuntimeError:
    """`step_error` for a key whose state was resumed from a snapshot an earlier run wrote.

    Raised when the builder fails on the snapshot, or the first call of the step's user
    code on the resumed state does (`flowspark.runtime.driver.StepDriver`): the message is
    `step_error`'s, then says where the state came from, what it was and how to start over,
    since the likely cause is a state whose shape changed with the code. Same classes as
    `step_error` (a `FlowsparkRuntimeError`, not a `TypeError` even for a `TypeError`
    cause); `exc` is the `__cause__`.

    Args:
        step_id: Fully qualified id of the step that failed.
        exc: What the step raised.
        key: The key.
        snapshot: The resumed snapshot (or bare state).
        store: Where the runtime keeps snapshots, for the fix (e.g. `"checkpoint directory"`).

    Returns:
        The error to raise (`raise resumed_error(...) from exc`).

    Example:
        >>> err = resumed_error("f.count", TypeError("'int' object is not iterable"), "ann", 3, "recovery directory")
        >>> text = str(err)
        >>> text.startswith("error in step 'f.count' for key 'ann': TypeError: 'int' object is not iterable; ")
        True
        >>> "written by an earlier run" in text, "(received int 3)" in text, "new recovery directory" in text
        (True, True, True)
        >>> isinstance(err, TypeError), err.__cause__
        (False, TypeError("'int' object is not iterable"))
    """
    err = step_error(step_id, exc, key=key)
    if err is exc:  # already wrapped by an inner step
        return err
    msg = (
        f"{err}; the key's state was resumed from a snapshot written by an earlier run of the step "
        f"(received {_type_name(snapshot)} {short_repr(snapshot, 80)}), and the state's shape may have changed "
        f"with the code since; to start over, run with a new {store}; to keep the state, migrate it (make the "
        "step's builder or function accept the old shape and convert it)"
    )
    return step_error(step_id, exc, msg, key)
