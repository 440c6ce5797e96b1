"""The shape of the package: imports go one way, and the layers stay where docs/architecture.md puts them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "flowspark"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Every flowspark module -> the flowspark modules it imports (at any depth of its code)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's `__init__` re-exports its modules; importing `pkg.mod` runs it, which is not a cycle."""
    packages = {m for m in graph if (ROOT.parent / m.replace(".", "/") / "__init__.py").exists()}
    return {m: {d for d in deps if d not in packages or d == m} for m, deps in graph.items()}


def test_no_import_cycle_among_flowspark_modules():
    cycle = _cycle(_without_packages(_imports()))
    assert cycle == [], " -> ".join(cycle)


def test_only_testing_imports_flowspark_testing():
    users = sorted(m for m, deps in _imports().items() if "flowspark.testing" in deps and m != "flowspark.testing")
    assert users == []


def test_pyspark_is_imported_only_under_flowspark_spark():
    offenders = []
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        if name.startswith("flowspark.spark"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            offenders += [f"{name}: {m}" for m in mods if m.split(".")[0] == "pyspark"]
    assert offenders == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


#: The layers of `flowspark/spark/`, lowest first: a module imports modules of its own layer or of
#: layers before it, never of a later one (docs/architecture.md draws them). A name ending in `.`
#: is a folder.
SPARK_LAYERS = (
    (
        "session",
        ("flowspark.spark.session", "flowspark.spark.compat", "flowspark.spark.carrier", "flowspark.spark.versions"),
    ),
    ("plan types", ("flowspark.spark.plan.types",)),
    ("worker", ("flowspark.spark.worker.",)),
    ("io", ("flowspark.spark.io.",)),
    ("compiler and rules", ("flowspark.spark.plan.compiler", "flowspark.spark.rules.")),
    ("lowerings", ("flowspark.spark.batch.", "flowspark.spark.streaming.")),
    ("entry points", ("flowspark.spark.api", "flowspark.spark.tools")),
)


def _layer(module: str) -> int | None:
    for i, (_name, members) in enumerate(SPARK_LAYERS):
        if any(module == m or (m.endswith(".") and module.startswith(m)) for m in members):
            return i
    return None


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for m, deps in graph.items():
        mine = _layer(m)
        if mine is None:
            continue
        for d in deps:
            theirs = _layer(d)
            if theirs is not None and theirs > mine:
                out.append(f"{m} ({SPARK_LAYERS[mine][0]}) imports {d} ({SPARK_LAYERS[theirs][0]})")
    return sorted(out)


def test_every_module_under_flowspark_spark_has_a_layer():
    graph = _imports()
    spark = [m for m in graph if m.startswith("flowspark.spark.") and not m.endswith(".__init__")]
    packages = {m for m in spark if (ROOT.parent / m.replace(".", "/") / "__init__.py").exists()}
    assert sorted(m for m in spark if m not in packages and _layer(m) is None) == []


def test_the_spark_layers_import_only_downwards():
    assert _layer_violations(_imports()) == []


def test_the_layer_check_finds_an_upward_import():
    graph = {"flowspark.spark.worker.stage": {"flowspark.spark.rules.optimizer"}, "flowspark.spark.io.x": set()}
    assert _layer_violations(graph) == [
        "flowspark.spark.worker.stage (worker) imports flowspark.spark.rules.optimizer (compiler and rules)"
    ]


def test_the_lowerings_do_not_import_each_other():
    """Batch and streaming share Spark helpers through the layers below them (`flowspark.spark.io.columns` ...)."""
    graph = _imports()
    streaming = {m for m in graph if m.startswith("flowspark.spark.streaming")}
    batch = {m for m in graph if m.startswith("flowspark.spark.batch")}
    assert not [(m, d) for m in streaming for d in graph[m] if d in batch]
    assert not [(m, d) for m in batch for d in graph[m] if d in streaming]


def test_at_most_eight_modules_at_the_top_of_flowspark_spark():
    top = sorted(p.name for p in SPARK.glob("*.py"))
    assert len(top) <= 8, top


def _private_imports() -> list[str]:
    """`from flowspark.X import _name` of a module's private name by another flowspark module."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flowspark"):
                names = [a.name for a in node.names if a.name.startswith("_")]
                names = [n for n in names if not (ROOT.parent / node.module.replace(".", "/") / f"{n}.py").exists()]
                found += [f"{_module_name(path)}: {node.module}.{n}" for n in names]  # a name, not a module
    return found


def test_no_module_imports_another_modules_private_names():
    assert _private_imports() == []


# --------------------------------------------------------------------------- sizes and complexity
SPARK = ROOT / "spark"
MAX_LINES = 800
MAX_COMPLEXITY = 25
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp, ast.match_case)


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Cyclomatic complexity of one function: 1 + its decision points.

    Each `if`/`elif`, `for`, `while`, `except` handler, conditional expression and `match`
    case counts 1, each operand of a boolean operator after the first 1, each comprehension's
    `for` 1 plus 1 per `if` of it. A nested function (or a class's methods) counts separately:
    its decision points are not the enclosing function's. A lambda's are.
    """
    n = 1
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            continue
        if isinstance(node, _BRANCHES):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        todo.extend(ast.iter_child_nodes(node))
    return n


def _functions(*dirs: Path) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """`(module:line name, node)` of every function (methods and nested ones too) of the modules under `dirs`."""
    found = []
    for d in dirs:
        for path in sorted(d.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, _FUNCTIONS):
                    found.append((f"{_module_name(path)}:{node.lineno} {node.name}", node))
    return found


def test_the_complexity_counter_counts_a_known_snippet():
    src = """
def f(xs, d):
    if xs and d or not xs:                  # if 1, and/or 2
        return [x for x in xs if x if x > 1]  # comprehension 1 + 2 ifs
    elif d:                                 # 1
        pass
    for x in xs:                            # 1
        while x:                            # 1
            x = x - 1 if x > 2 else 0       # 1
    try:
        pass
    except ValueError:                      # 1
        pass
    except (KeyError, TypeError):           # 1
        pass
    match d:
        case 1:                             # 1
            pass
        case _:                             # 1
            pass

    def nested(y):                          # counts separately
        return y if y else (lambda z: z or 1)

    return {k: v for k, v in d.items()} or nested  # comprehension 1, or 1
"""
    fns = {n.name: n for n in ast.walk(ast.parse(src)) if isinstance(n, _FUNCTIONS)}
    assert complexity(fns["f"]) == 1 + 3 + 3 + 1 + 1 + 1 + 1 + 2 + 2 + 2
    assert complexity(fns["nested"]) == 1 + 1 + 1
    assert complexity(ast.parse("def g():\n    return 1\n").body[0]) == 1


def test_no_file_under_flowspark_spark_is_over_800_lines():
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text().splitlines()) for p in SPARK.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_no_function_of_flowspark_is_over_complexity_25():
    scores = {name: complexity(fn) for name, fn in _functions(ROOT)}
    assert len(scores) > 1000  # the walk found the functions
    assert {name: c for name, c in scores.items() if c > MAX_COMPLEXITY} == {}


# --------------------------------------------------------------------------- pyspark's private APIs
#: pyspark's and Py4J's private names (attributes, and the JVM classes reached through them):
#: used in `flowspark/spark/compat.py` only.
PRIVATE_PYSPARK = frozenset(
    {
        "_jvm",
        "_jdf",
        "_jsc",
        "_jsparkSession",
        "_jlistener",
        "_gateway",
        "_explain_string",
        "_instantiatedSession",
        "_inferSchemaFromList",
        "_collect_as_arrow",
        "_DYNAMIC_CLASS_TRACKER_BY_CLASS",
        "statusStore",
        "PythonSQLUtils",
        "PythonStreamingQueryListener",
        "PythonStreamingQueryListenerWrapper",
    }
)


def _private_pyspark_uses(source: str) -> list[str]:
    """`"line name"` wherever `source` names one of `PRIVATE_PYSPARK`: in code (attributes, names,
    definitions, imports) or in a string. Docstrings may mention them.
    """
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, *_FUNCTIONS))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.ImportFrom):
            names = [*(node.module or "").split("."), *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [part for a in node.names for part in a.name.split(".")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [n for n in PRIVATE_PYSPARK if n in node.value]
        else:
            continue
        found += [f"{node.lineno} {n}" for n in names if n in PRIVATE_PYSPARK]
    return found


def test_only_compat_uses_pysparks_private_apis():
    compat = SPARK / "compat.py"
    offenders = [
        f"{_module_name(p)}:{use}"
        for p in sorted(ROOT.rglob("*.py"))
        if p != compat
        for use in _private_pyspark_uses(p.read_text())
    ]
    assert offenders == []
    assert len(_private_pyspark_uses(compat.read_text())) >= 10  # the scan sees them where they are


def test_the_private_api_scan_finds_code_and_strings_but_not_docstrings():
    src = (
        '"""Mentions _jvm."""\n'
        "from pyspark.sql import SparkSession\n"
        "def f(spark):\n"
        '    """And statusStore."""\n'
        "    spark.sparkContext._jvm.x\n"
        "    SparkSession._instantiatedSession\n"
        '    return "org.apache.spark.sql.streaming.PythonStreamingQueryListener"\n'
        "def _jlistener():\n"
        "    from py4j import _gateway\n"
    )
    assert sorted(_private_pyspark_uses(src)) == [
        "5 _jvm",
        "6 _instantiatedSession",
        "7 PythonStreamingQueryListener",
        "8 _jlistener",
        "9 _gateway",
    ]
    assert _private_pyspark_uses("def f(spark):\n    return spark.sparkContext.jvm_like\n") == []


# --------------------------------------------------------------------------- the plan
def test_the_plan_imports_no_runtime_and_no_lowering():
    graph = _imports()
    lowerings = ("flowspark.runtime", "flowspark.spark.batch", "flowspark.spark.streaming", "flowspark.spark.rules")
    for module in ("flowspark.spark.plan.types", "flowspark.spark.plan.compiler"):
        assert sorted(d for d in graph[module] if d.startswith(lowerings) and d != "flowspark.runtime.tags") == []
    assert graph["flowspark.spark.plan.types"] <= {"flowspark.ir"}


def test_no_rules_module_is_over_400_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (SPARK / "rules").glob("*.py")}
    assert len(sizes) >= 8
    assert {p: n for p, n in sizes.items() if n > 400} == {}
