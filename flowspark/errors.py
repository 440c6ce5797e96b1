"""Errors raised by flowspark.

Every error a user can see derives from `FlowsparkError`. Errors about bad
input are also `ValueError` or `TypeError`, so code written for Bytewax that
catches those keeps working.

```
FlowsparkError
├── FlowsparkBuildError          (+ ValueError)  the dataflow is malformed
│   └── DuplicateStepError                      a step id is used twice
├── FlowsparkTypeError           (+ TypeError)   an argument of the wrong type
├── FlowsparkCompileError        (+ ValueError)  a runtime cannot run this flow
├── FlowsparkRuntimeError        (+ RuntimeError) a user callable failed while running;
│                                                 names the step, chains the cause
├── RecoveryError                (+ ValueError)  recovery store missing or inconsistent
│   ├── NoPartitionsError
│   ├── MissingPartitionsError
│   └── InconsistentPartitionsError
└── ImportStrError               (+ ValueError)  a CLI import string did not resolve
```
"""

from __future__ import annotations

from typing import Any, Optional


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

    Every runtime words it the same way (`from_error`):
    `error in step 'flow.step' for key 'k': KeyError: 'user'`.

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
    ) -> None:
        """Create the error.

        Args:
            step_id: Fully qualified step id.
            message: What happened.
            key: The key being processed, if any.
            exc_type: Name of the original exception's type.
            exc_message: The original exception's message.
        """
        super().__init__(message)
        self.step_id = step_id
        self.key = key
        self.exc_type = exc_type
        self.exc_message = exc_message

    def __reduce__(self) -> Any:
        """Pickle with every attribute (errors travel from Spark workers)."""
        return (type(self), (self.step_id, str(self), self.key, self.exc_type, self.exc_message))

    @classmethod
    def describe(
        cls, step_id: str, exc_type: str, exc_message: str, key: Optional[str] = None
    ) -> FlowsparkRuntimeError:
        """Build the error from its parts (the one wording every runtime uses).

        Args:
            step_id: Fully qualified step id.
            exc_type: Name of the original exception's type.
            exc_message: The original exception's message.
            key: The key being processed, if any.

        Returns:
            The error (no cause attached).
        """
        where = f"step {step_id!r}" if key is None else f"step {step_id!r} for key {key!r}"
        return cls(step_id, f"error in {where}: {exc_type}: {exc_message}", key, exc_type, exc_message)

    @classmethod
    def from_error(cls, step_id: str, error: BaseException, key: Optional[str] = None) -> FlowsparkRuntimeError:
        """Wrap an exception raised by user code (or by a check of its result) in a step.

        A `FlowsparkRuntimeError` is returned unchanged (it already names its step).

        Args:
            step_id: Fully qualified step id.
            error: The exception.
            key: The key being processed, if any.

        Returns:
            The error, with `error` as its `__cause__`.

        Example:
            >>> str(FlowsparkRuntimeError.from_error("f.count", KeyError("user"), key="ann"))
            "error in step 'f.count' for key 'ann': KeyError: 'user'"
        """
        if isinstance(error, FlowsparkRuntimeError):
            return error
        err = cls.describe(step_id, type(error).__name__, str(error), key)
        err.__cause__ = error
        return err


class RecoveryError(FlowsparkError, ValueError):
    """The recovery store is missing, incomplete or inconsistent."""


class NoPartitionsError(RecoveryError):
    """The recovery directory holds no partitions."""


class MissingPartitionsError(RecoveryError):
    """Some recovery partitions are missing."""


class InconsistentPartitionsError(RecoveryError):
    """Recovery partitions disagree with each other."""


class ImportStrError(FlowsparkError, ValueError):
    """An import string given on the command line did not resolve to a Dataflow."""
