"""Resolve a command-line import string to a `Dataflow`.

An import string is `module[:attr]` or `path/file.py[:attr]`. `attr` defaults
to `flow` and is either a module-level name or a call of a module-level
function with literal arguments: `get_flow('x', n=2)`. Arguments are parsed
with `ast.literal_eval`, so only literals (strings, numbers, tuples, lists,
dicts, sets, `True`/`False`/`None`) are allowed; nothing is evaluated.

Everything that is wrong with the string itself (bad syntax, a module or file
that does not exist, a missing attribute, an object that is not a `Dataflow`,
a factory called with arguments it does not take) raises `ImportStrError` with
a one-line message that says what was wrong and how to fix it. Exceptions
raised by the user's module or factory while running propagate unchanged.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from flowspark.dataflow import Dataflow
from flowspark.errors import ImportStrError

__all__ = ["ImportStr", "locate_dataflow", "module_for_file", "parse_import_str"]

_FORMS = "`module[:attr]` or `path/file.py[:attr]` (e.g. `my_flows:flow` or `flows/wordcount.py:get_flow('x')`)"


@dataclass(frozen=True)
class ImportStr:
    """A parsed import string.

    Attributes:
        text: The import string as given.
        target: The module name or file path before the `:`.
        is_file: Whether `target` is a file path.
        attr: The attribute name (`flow` by default).
        call: Whether `attr` is called (`get_flow(...)`).
        args: Positional literal arguments of the call.
        kwargs: Keyword literal arguments of the call.
    """

    text: str
    target: str
    is_file: bool
    attr: str = "flow"
    call: bool = False
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def _fail(msg: str) -> ImportStrError:
    return ImportStrError(" ".join(msg.split("\n")))


def _short(obj: Any, limit: int = 60) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001
        text = f"<{type(obj).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_attr(text: str, attr_text: str) -> tuple[str, bool, tuple[Any, ...], dict[str, Any]]:
    hint = "after ':' give a name like `flow` or a call with literal arguments like `get_flow('x', n=2)`"
    try:
        expr = ast.parse(attr_text.strip(), mode="eval").body
    except SyntaxError:
        msg = f"cannot parse {attr_text!r} in import string {text!r}; {hint}"
        raise _fail(msg) from None
    if isinstance(expr, ast.Name):
        return expr.id, False, (), {}
    if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Name):
        msg = f"{attr_text!r} in import string {text!r} is neither a name nor a simple function call; {hint}"
        raise _fail(msg)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for node in [*expr.args, *(kw.value for kw in expr.keywords)]:
        if isinstance(node, ast.Starred):
            msg = f"`*{ast.unparse(node.value)}` in {attr_text!r} is not allowed; write the arguments out"
            raise _fail(msg)
    for kw in expr.keywords:
        if kw.arg is None:
            msg = f"`**{ast.unparse(kw.value)}` in {attr_text!r} is not allowed; write the keyword arguments out"
            raise _fail(msg)
    try:
        for node in expr.args:
            args.append(ast.literal_eval(node))
        for kw in expr.keywords:
            kwargs[str(kw.arg)] = ast.literal_eval(kw.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        bad = next(n for n in [*expr.args, *(kw.value for kw in expr.keywords)] if not _is_literal(n))
        msg = (
            f"argument `{ast.unparse(bad)}` of {attr_text!r} is not a literal; factory arguments must be "
            "literals (str, numbers, True/False/None, tuples, lists, dicts); quote strings like 'x'"
        )
        raise _fail(msg) from None
    return expr.func.id, True, tuple(args), kwargs


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def parse_import_str(text: str) -> ImportStr:
    """Parse an import string without importing anything.

    Args:
        text: `module[:attr]` or `path/file.py[:attr]`.

    Returns:
        The parsed parts.

    Raises:
        ImportStrError: The string is malformed.

    Example:
        >>> spec = parse_import_str("pkg.flows:get_flow('x', n=2)")
        >>> spec.target, spec.attr, spec.args, spec.kwargs
        ('pkg.flows', 'get_flow', ('x',), {'n': 2})
        >>> parse_import_str("flows/wc.py").attr
        'flow'
    """
    if not isinstance(text, str) or not text.strip():
        msg = f"empty import string; give {_FORMS}"
        raise _fail(msg)
    text = text.strip()
    target, sep, attr_text = text.partition(":")
    target = target.strip()
    if not target:
        msg = f"import string {text!r} names no module or file before ':'; give {_FORMS}"
        raise _fail(msg)
    if sep and not attr_text.strip():
        msg = f"import string {text!r} has nothing after ':'; drop the ':' to use `flow`, or name the attribute"
        raise _fail(msg)
    attr, call, args, kwargs = _parse_attr(text, attr_text) if sep else ("flow", False, (), {})
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if not is_file and not all(_module_part(part) for part in target.split(".")):
        msg = (
            f"{target!r} in import string {text!r} is neither a module name (dotted names) nor a path "
            f"to a .py file; give {_FORMS}"
        )
        raise _fail(msg)
    return ImportStr(text, target, is_file, attr, call, args, kwargs)


def _module_part(part: str) -> bool:
    """Whether `part` can be one name of a dotted module name `importlib` imports.

    As in Bytewax, any name a file can have is taken (`examples.1brc` imports `examples/1brc.py`,
    which is no identifier); only an empty part or one with spaces or path separators is refused.

    Example:
        >>> [_module_part(p) for p in ("flows", "1brc", "my-flow", "", "a b", "a/b")]
        [True, True, True, False, False, False]
    """
    return bool(part) and not any(c.isspace() or c in "/\\" for c in part)


def module_for_file(spec: ImportStr) -> tuple[str, Path, Path]:
    """Return `(module name, sys.path entry, expected __file__)` for a file import string."""
    path = Path(spec.target).expanduser().resolve()
    if path.is_dir():
        init = path / "__init__.py"
        if not init.is_file():
            msg = f"{spec.target!r} is a directory, not a .py file; give the path of the file that builds the flow"
            raise _fail(msg)
        path = init
    if not path.exists():
        msg = f"file {spec.target!r} does not exist (resolved to {str(path)!r}); check the path"
        raise _fail(msg)
    if path.suffix != ".py":
        msg = f"{spec.target!r} is not a .py file; give the path of the Python file that builds the flow"
        raise _fail(msg)
    # Walk up out of packages (directories with __init__.py) so relative imports work.
    parts = [] if path.stem == "__init__" else [path.stem]
    root = path.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if not parts or not all(_module_part(p) and "." not in p for p in parts):
        msg = (
            f"{spec.target!r} would be imported as module {'.'.join(parts)!r}, which is not a module name "
            "importlib can import; rename the file (no '.' or spaces before '.py')"
        )
        raise _fail(msg)
    return ".".join(parts), root, path


def _shadowed(spec: ImportStr, name: str, module: Any, expected: Path) -> Optional[ImportStrError]:
    found = getattr(module, "__file__", None)
    if found is not None and Path(found).resolve() == expected:
        return None
    where = f"by {found!r}" if found else "by a built-in module"
    return _fail(
        f"{spec.target!r} would be imported as module {name!r}, but that name is already taken {where}; "
        "rename your file"
    )


def _import(spec: ImportStr) -> Any:
    if spec.is_file:
        name, root, expected = module_for_file(spec)
        already = sys.modules.get(name)
        if already is not None:
            err = _shadowed(spec, name, already, expected)
            if err is not None:
                raise err
        if not sys.path or sys.path[0] != str(root):
            sys.path.insert(0, str(root))
    else:
        name = spec.target
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as ex:
        missing = ex.name or ""
        if missing == name or name.startswith(missing + "."):
            what = "module" if missing == name else "package"
            msg = (
                f"{what} {missing!r} of import string {spec.text!r} not found (searched the current directory "
                f"{os.getcwd()!r} and sys.path); check the spelling, run from the directory that contains it, "
                "or give a file path like `path/to/flows.py`"
            )
            raise _fail(msg) from None
        raise
    if spec.is_file:
        err = _shadowed(spec, name, module, expected)
        if err is not None:
            raise err
    return module


def _what_is_there(spec: ImportStr, module: Any) -> str:
    names = vars(module)
    flows = sorted(k for k, v in names.items() if isinstance(v, Dataflow))
    if flows:
        return "it defines " + ", ".join(f"`{spec.target}:{f}`" for f in flows)
    funcs = sorted(
        k
        for k, v in names.items()
        if inspect.isfunction(v) and v.__module__ == module.__name__ and not k.startswith("_")
    )
    if funcs:
        shown = ", ".join(f"`{spec.target}:{f}(...)`" for f in funcs[:5])
        return f"it defines no Dataflow at module level; if a function builds it, call it: {shown}"
    return (
        "it defines no Dataflow or function at module level; name the variable or factory after ':' "
        f"(e.g. `{spec.target}:my_flow`)"
    )


def locate_dataflow(text: str) -> Dataflow:
    """Import the module an import string names and return its `Dataflow`.

    A name that refers to a function is called with no arguments, as Bytewax
    does; `get_flow(...)` calls it with the given literal arguments.

    Args:
        text: `module[:attr]` or `path/file.py[:attr]`.

    Returns:
        The dataflow.

    Raises:
        ImportStrError: The string is malformed, its module or file does not
            exist, the attribute is missing, the factory does not accept the
            arguments, or the object is not a flowspark `Dataflow`.

    Example:
        >>> try:
        ...     locate_dataflow("flowspark.dataflow:no_such_flow")
        ... except ImportStrError as e:
        ...     print(str(e)[:63])
        module 'flowspark.dataflow' has no attribute 'no_such_flow'; it
    """
    spec = parse_import_str(text)
    module = _import(spec)
    where = f"module {module.__name__!r}"
    if not hasattr(module, spec.attr):
        msg = f"{where} has no attribute {spec.attr!r}; {_what_is_there(spec, module)}"
        raise _fail(msg)
    obj = getattr(module, spec.attr)
    shown = f"{spec.target}:{spec.attr}"
    if spec.call:
        if not callable(obj):
            msg = (
                f"`{shown}` is not a function (it is {_short(obj)} of type {type(obj).__name__}), so it cannot "
                f"be called; drop the parentheses (`{shown}`)"
            )
            raise _fail(msg)
        obj = _call(spec, obj, shown)
    elif inspect.isfunction(obj):
        obj = _call(spec, obj, shown)
    if isinstance(obj, Dataflow):
        return obj
    got = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if type(obj).__module__.split(".")[0] == "bytewax":
        msg = (
            f"`{spec.text}` is a Bytewax Dataflow ({got}); build it with flowspark instead "
            "(`from flowspark.dataflow import Dataflow`, `import flowspark.operators as op`)"
        )
        raise _fail(msg)
    msg = (
        f"`{spec.text}` gave {_short(obj)} of type {got}, not a flowspark Dataflow; point the import string "
        "at a `flowspark.dataflow.Dataflow` or at a function that returns one"
    )
    raise _fail(msg)


def _call(spec: ImportStr, fn: Any, shown: str) -> Any:
    try:
        sig: Optional[inspect.Signature] = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        try:
            sig.bind(*spec.args, **spec.kwargs)
        except TypeError as ex:
            given = ", ".join([*(repr(a) for a in spec.args), *(f"{k}={v!r}" for k, v in spec.kwargs.items())])
            msg = f"cannot call factory `{shown}` with ({given}): {ex}; its signature is {spec.attr}{sig}"
            raise _fail(msg) from None
    return fn(*spec.args, **spec.kwargs)
