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

__all__ = ["column_of", "pair_row_of"]

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
    ins = _body(fn)
    if ins is None or len(ins) != 4:
        return None
    item = _item_of(fn, ins[:3])
    if type(item) is not str or ins[3].opname != "RETURN_VALUE":
        return None
    return item


def pair_row_of(fn: Any) -> Optional[tuple[str, str]]:
    """The fields a mapper of `(key, value)` pairs puts them in, or `None` when `fn` is not proven to be that.

    Recognised: a plain function or lambda of one parameter (as `column_of`) whose whole
    body is `return {"<name>": kv[0], "<other name>": kv[1]}` (either order, two distinct
    `str` names): each pair becomes the dict `{name: key, other name: value}`.

    Args:
        fn: The mapper (`op.map`'s).

    Returns:
        `(the key's field, the value's field)`, or `None`.

    Example:
        >>> pair_row_of(lambda kv: {"user": kv[0], "n": kv[1]})
        ('user', 'n')
        >>> pair_row_of(lambda kv: {"user": kv[0], "n": kv[1] + 1}) is None
        True
    """
    ins = _body(fn)
    if ins is None or len(ins) != 9 or ins[-1].opname != "RETURN_VALUE":
        return None
    build = ins[-2]
    if build.opname == "BUILD_CONST_KEY_MAP" and build.argval == 2:
        names = ins[-3].argval if ins[-3].opname == "LOAD_CONST" else None
        items = (_item_of(fn, ins[0:3]), _item_of(fn, ins[3:6]))
    elif build.opname == "BUILD_MAP" and build.argval == 2:
        consts = (ins[0], ins[4])
        names = tuple(c.argval for c in consts) if all(c.opname == "LOAD_CONST" for c in consts) else None
        items = (_item_of(fn, ins[1:4]), _item_of(fn, ins[5:8]))
    else:
        return None
    if type(names) is not tuple or len(names) != 2 or not all(type(n) is str for n in names) or names[0] == names[1]:
        return None
    fields = dict(zip(items, names, strict=True))
    if set(fields) != {0, 1} or any(type(i) is not int for i in items):
        return None
    return fields[0], fields[1]


def _body(fn: Any) -> Optional[list[dis.Instruction]]:
    """The instructions of a plain function of one parameter (no defaults, closure or globals), or `None`."""
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
    return [i for i in dis.get_instructions(code) if i.opname not in _IGNORED]


def _item_of(fn: Any, ins: list[dis.Instruction]) -> Any:
    """`c` when three instructions are `param[c]` for a constant `c` (a `str` or an `int`), else `None`."""
    load, const, subscr = ins
    if not (load.opname.startswith("LOAD_FAST") and load.argval == fn.__code__.co_varnames[0]):
        return None
    if const.opname != "LOAD_CONST" or type(const.argval) not in (str, int):
        return None
    if subscr.opname != "BINARY_SUBSCR" and not (subscr.opname == "BINARY_OP" and subscr.argrepr == "[]"):
        return None
    return const.argval
