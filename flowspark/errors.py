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

    Attributes:
        step_id: The fully qualified id of the step that failed.
    """

    def __init__(self, step_id: str, message: str) -> None:
        """Create the error.

        Args:
            step_id: Fully qualified step id.
            message: What happened.
        """
        super().__init__(message)
        self.step_id = step_id


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
