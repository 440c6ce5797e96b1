"""The user guide: the operator reference covers every public operator and is up to date; links resolve."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import flowspark.operators as op

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_operators", DOCS / "gen_operators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _modules():
    mods = [("op", op)]
    try:
        import flowspark.operators.windowing as win
    except ImportError:
        return mods
    return [*mods, ("win", win)]


def _sections(text):
    """`{heading: body}` for every `### ` entry of operators.md."""
    parts = re.split(r"^### `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_public_name_has_an_entry():
    sections = _sections((DOCS / "operators.md").read_text())
    missing = [
        f"{prefix}.{name}" for prefix, mod in _modules() for name in mod.__all__ if f"{prefix}.{name}" not in sections
    ]
    assert missing == []
    extra = set(sections) - {f"{p}.{n}" for p, m in _modules() for n in m.__all__}
    assert extra == set()


def test_every_operator_has_an_example():
    sections = _sections((DOCS / "operators.md").read_text())
    for prefix, mod in _modules():
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and "step_id" in inspect.signature(obj).parameters:
                body = sections[f"{prefix}.{name}"]
                assert "**Example:**" in body, f"{prefix}.{name} has no example"
                assert f"{prefix}.{name}(" in body.split("**Example:**")[1], (
                    f"{prefix}.{name}: example does not call it"
                )


def test_operator_reference_is_generated_from_current_docstrings():
    assert (DOCS / "operators.md").read_text() == _gen().render(), "run `python docs/gen_operators.py`"


def test_generator_documents_a_new_operator(monkeypatch):
    """The reference test can fail: an operator added to __all__ without docs is reported."""
    gen = _gen()

    def brand_new(step_id, up):
        """Do something new.

        Example:
            >>> 1 + 1
            2
        """

    monkeypatch.setattr(op, "brand_new", brand_new, raising=False)
    monkeypatch.setattr(op, "__all__", [*op.__all__, "brand_new"])
    text = gen.render()
    assert "### `op.brand_new`" in text
    assert text != (DOCS / "operators.md").read_text()


@pytest.mark.parametrize(
    "page", ["README.md", "concepts.md", "differences.md", "deployment.md", "operators.md", "porting.md"]
)
def test_links_between_pages_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", text):
        if target in ("streaming.md", "spark.md"):
            continue  # written with the Spark runtimes
        assert (DOCS / target).is_file(), f"{page} links to missing {target}"


def test_operator_anchors_resolve():
    text = (DOCS / "operators.md").read_text()
    anchors = {re.sub(r"[^\w-]", "", h.lower()) for h in re.findall(r"^### `([^`]+)`", text, flags=re.M)}
    for link in re.findall(r"\]\(#([\w-]+)\)", text):
        assert link in anchors, link
