"""Recognise key functions that read one column of a row: `lambda r: r["user"]`.

`op.key_on` records the column in the IR (`ir.FlatMapBatch.key_column`) when its key
function is *proven* to return `item[column]` for every item, so a runtime whose items
are rows (the Spark batch lowering of a `SparkSource`) may compute the key from the
column itself. Recognised, and nothing else:

- `operator.itemgetter("user")` (exactly one `str` item);
- a plain function or lambda of one positional parameter, without defaults, closure
  or globals, whose whole body is `return <param>["<str constant>"]`.

Anything else (a method call such as `r.get("user")`, a conversion, two columns, a
`functools.partial`, a callable object) is not recognised and keeps the Python pass.
"""

from __future__ import annotations

import dis
import inspect
import operator
import types
from typing import Any, Optional

__all__ = ["column_of"]

#: Instructions that do nothing observable (interpreter bookkeeping).
_IGNORED = frozenset({"RESUME", "NOP", "CACHE", "EXTENDED_ARG"})


def column_of(fn: Any) -> Optional[str]:
    """The column a key function reads, or `None` when `fn` is not proven to be `item[column]`.

    Args:
        fn: The key function.

    Returns:
        The column name, or `None`.

    Example:
        >>> column_of(lambda r: r["user"]), column_of(operator.itemgetter("user"))
        ('user', 'user')
        >>> column_of(lambda r: r["user"].lower()) is None, column_of(lambda r: r.get("user")) is None
        (True, True)
    """
    if type(fn) is operator.itemgetter:
        args = fn.__reduce__()[1]
        if len(args) == 1 and type(args[0]) is str:
            return args[0]
        return None
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    if (
        code.co_argcount != 1
        or code.co_posonlyargcount
        or code.co_kwonlyargcount
        or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR | inspect.CO_COROUTINE)
        or code.co_freevars
        or code.co_cellvars
        or fn.__defaults__
        or fn.__kwdefaults__
    ):
        return None
    ins = [i for i in dis.get_instructions(code) if i.opname not in _IGNORED]
    if len(ins) != 4:
        return None
    load, const, subscr, ret = ins
    if not (load.opname.startswith("LOAD_FAST") and load.argval == code.co_varnames[0]):
        return None
    if const.opname != "LOAD_CONST" or type(const.argval) is not str:
        return None
    if subscr.opname != "BINARY_SUBSCR" and not (subscr.opname == "BINARY_OP" and subscr.argrepr == "[]"):
        return None
    if ret.opname != "RETURN_VALUE":
        return None
    return const.argval
