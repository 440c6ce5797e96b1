"""Names of a package imported on first use (PEP 562), so that importing one submodule stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Callable

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """Build a package's module-level `__getattr__` that imports each name from its home module.

    A Python worker that unpickles a function of one submodule imports the package first;
    with its names imported on first use it does not import every submodule they live in.

    Args:
        package: The package's name (for the error).
        homes: `{name: module}`: where each public name lives.
        namespace: The package's `globals()`: a name, once imported, is kept there.

    Returns:
        The `__getattr__`.
    """

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg)
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return getattr_
