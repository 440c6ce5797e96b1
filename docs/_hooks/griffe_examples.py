"""A griffe extension: read `Example:` sections as doctests.

flowspark's docstrings title their doctests `Example:`; griffe's Google parser reads only `Examples:` as
doctests (it renders `Example:` as an admonition of Markdown text).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", flags=re.M)


class ExampleSections(griffe.Extension):
    """Rename `Example:` sections to `Examples:` before the docstring is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite one object's docstring."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
