"""Local paths: whether a path names a local directory (no pyspark needed), and what a relative one is relative to."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["cwd_note", "is_local"]


def is_local(path: str, schemes: tuple[str, ...] = ("", "file")) -> bool:
    """Whether `path` is a local path: its scheme is one of `schemes` (default none or `file:`).

    Example:
        >>> is_local("/data/chk"), is_local("file:///data/chk"), is_local("s3a://b/chk"), is_local("dbfs:/chk")
        (True, True, False, False)
    """
    return urlparse(path).scheme in schemes or (len(path) > 1 and path[1] == ":")  # C:\\... on Windows


def cwd_note(path: Path) -> str:
    """For a relative path, say what it was resolved against (empty for absolute paths)."""
    return "" if path.is_absolute() else f" (relative to the current directory {os.getcwd()!r})"
