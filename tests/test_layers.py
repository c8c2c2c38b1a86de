"""Packages depend one way (docs/design.md, "Layers"): a walk over every import in quantize/, function-level
imports included, so a shortcut added later fails here rather than in review. Each rule is also shown to
catch a planted violation, so a rule that cannot fail is found too."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from conftest import ROOT

PKG = ROOT / "quantize"
MODEL_LOADING = (
    "torch",
    "transformers",
    "lm_eval",
    "llmcompressor",
    "quantize.checkpoint.loader",
    "quantize.evaluate",  # but for its LIGHT modules, where a rule allows them
    "quantize.convert.engine",
    "quantize.convert.checks",
)
# The evaluation modules that load no model: a suite, the evaluation cache's keys and checked lookups, and which
# engine scores a checkpoint. Gates, the report and flows read them; they never import a library that loads or
# scores a model, nor anything that does.
LIGHT = ("quantize.evaluate", "quantize.evaluate.suite", "quantize.evaluate.cache", "quantize.evaluate.engine")
HEAVY = ("torch", "transformers", "lm_eval", "llmcompressor", "vllm", "compressed_tensors", "datasets", "llama_cpp")
# what a function-level import keeps off `import quantize` and the CLI's refusals: HEAVY (the libraries that load a
# model, which the rules above ban) and the libraries slow to import (the cluster's ray, scipy's statistics, ...)
SLOW = (
    *HEAVY,
    "ray",
    "peft",
    "gptqmodel",
    "safetensors.torch",
    "matplotlib",
    "scipy",
    "huggingface_hub",
    "pandas",
    "pyarrow",
)
STAGES = (
    "quantize.checkpoint",
    "quantize.convert",
    "quantize.evaluate",
    "quantize.gates",
    "quantize.flows",
    "quantize.report",
    "quantize.search",
    "quantize.sweep",
    "quantize.cost",
    "quantize.golden",
    "quantize.compat",
    "quantize.cluster",
    "quantize.api",
    "quantize.cli",
)
FOUNDATION = (
    "patterns",
    "errors",
    "config",
    "io",
    "records",
    "kinds",
    "stats",
    "cache",
    "tables",
    "quiet",
    "names",
    "progress",
    "machine",
)
# each record's module (quantize/records/: one per file the pipeline writes), found on disk so that a new one falls
# under the rule below; the package's index (__init__) and base.py, which every record's module imports, are not
RECORD_MODULES = tuple(
    f"quantize.records.{p.stem}" for p in sorted((PKG / "records").glob("*.py")) if p.stem not in ("__init__", "base")
)
TOP = ("quantize", "quantize.cli")  # the root package (it re-exports the API) and the CLI: nothing imports them

# (package, imports it must never make directly or through the modules it imports, why[, modules of a banned
# package it may import after all]): every module under quantize/ falls under at least one (a test checks it)
RULES = [
    (
        "quantize.evaluate",
        ("quantize.gates", "quantize.report", "quantize.flows", "quantize.search", "quantize.sweep"),
        "evaluation scores; it does not decide",
    ),
    *[
        (m, HEAVY, "the suite and the evaluation cache load no model: gates, the report and flows read them")
        for m in LIGHT[1:]
    ],
    (
        "quantize.gates",
        (*MODEL_LOADING, "quantize.report", "quantize.flows", "quantize.search", "quantize.sweep"),
        "gates decide from records, never load a model",
        LIGHT,
    ),
    (
        "quantize.report",
        (*MODEL_LOADING, "quantize.flows", "quantize.search", "quantize.sweep"),
        "the report reads records, it scores nothing",
        LIGHT,
    ),
    ("quantize.flows", ("quantize.search", "quantize.sweep"), "search and sweep call the flows, never the reverse"),
    ("quantize.sweep", ("quantize.search",), "a search may run a sweep's steps; a sweep runs no search"),
    (
        "quantize.cluster",
        (*HEAVY, *(p for p in STAGES if p != "quantize.cluster")),
        "the cluster runs the tasks sweep and search hand it (what a worker runs is their function): it imports "
        "neither, nor any other stage, nor a library that loads a model",
    ),
    (
        "quantize.stats",
        ("quantize.evaluate", "quantize.gates", "quantize.report", "torch", "transformers"),
        "statistics are pure",
    ),
    (
        "quantize.records",
        ("quantize.evaluate", "quantize.gates", "quantize.report", "torch", "transformers"),
        "records are plain data",
    ),
    *[
        (
            m,
            tuple(o for o in RECORD_MODULES if o != m),
            "a record's module imports the foundation and records' base alone: a name two records use lives in "
            "quantize/records/base.py, and the index (quantize/records/__init__.py) imports the records",
        )
        for m in RECORD_MODULES
    ],
    ("quantize.cache", (*MODEL_LOADING[:4], "quantize.evaluate", "quantize.gates"), "the cache only finds files"),
    *[(f"quantize.{m}", STAGES, "the foundation sits below every stage") for m in FOUNDATION],
    (
        "quantize.checkpoint",
        tuple(p for p in STAGES if p not in ("quantize.checkpoint", "quantize.compat")),
        "a checkpoint is read by the stages; it knows none of them",
    ),
    (
        "quantize.convert",
        (*STAGES[2:9], "quantize.api", "quantize.cli"),
        "conversion writes checkpoints; it neither scores nor decides",
    ),
    (
        "quantize.golden",
        tuple(p for p in STAGES if p != "quantize.compat"),
        "golden sets are data the stages read",
    ),
    (
        "quantize.cost",
        (*MODEL_LOADING, "quantize.gates", "quantize.flows", "quantize.report", "quantize.search", "quantize.sweep"),
        "cost is arithmetic over bytes",
    ),
    ("quantize.compat", tuple(p for p in STAGES if p != "quantize.compat"), "compat wraps libraries, not stages"),
    ("quantize.api", ("quantize.cli",), "the CLI is a layer over the API, not under it"),
    *[
        (p, ("quantize.api",), "the API sits over the stages, beside the CLI; nothing below calls it")
        for p in (*STAGES[:-2], *(f"quantize.{m}" for m in FOUNDATION))
    ],
    *[(p, ("quantize.cli",), "nothing calls the CLI") for p in (*STAGES[:-1], *(f"quantize.{m}" for m in FOUNDATION))],
]

# (what, who may import it directly, why): a name imported, or reached as an attribute of an imported module
ONLY = [
    ("hashlib", {"quantize.io"}, "io.py is the one hashing helper"),
    (
        "quantize.cache.cache_dir",
        {"quantize.cache", "quantize.evaluate.cache", "quantize.checkpoint.loader"},
        "cache paths are built in cache.py (memos) and evaluate/cache.py (scores, agreement, sensitivities)",
    ),
    (
        "quantize.io.sha256_json",
        {"quantize.cache", "quantize.evaluate.cache", "quantize.evaluate.suite", "quantize.convert.engine"},
        "cache keys are built in cache.py and evaluate/cache.py (the suite hashes its own settings; the engine its "
        "resolved recipe)",
    ),
]
ENGINE_NEVER = (
    "quantize.convert.backends.llmcompressor",
    "quantize.convert.backends.gptqmodel",
    "llmcompressor",
    "gptqmodel",
    "optimum",
)


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_by(node: ast.Import | ast.ImportFrom, module: str, is_package: bool = False) -> list[tuple[str, str]]:
    """(the name it binds, the absolute name) for each name one import statement brings; a plain `import` is
    followed into attributes only when aliased (the bound name is "" otherwise). `from quantize import x` brings
    the root package's `x` (a module, or a name quantize/__init__.py defines, as `__version__`), not the bare root."""
    if isinstance(node, ast.Import):
        return [(a.asname or "", a.name) for a in node.names]
    if not node.module:
        return []
    base = node.module
    if node.level:  # relative import: resolve against the package
        pkg = module.split(".")[: len(module.split(".")) - node.level + is_package]
        base = ".".join([*pkg, node.module])
    return [("", base)] * (base != "quantize") + [(a.asname or a.name, f"{base}.{a.name}") for a in node.names]


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Absolute names of every module or name a module's source imports, anywhere in it, and of every attribute
    it reads from an imported quantize module (`cache.cache_dir` after `from quantize import cache`)."""
    out, aliases = set(), {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for bound, name in imported_by(node, module, is_package):
                out.add(name)
                if bound:
                    aliases[bound] = name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            target = aliases[node.value.id]
            if target.startswith("quantize."):
                out.add(f"{target}.{node.attr}")
    return out


def package_imports() -> dict[str, set[str]]:
    return {m: set(names) for m, names in _parsed().items()}


@functools.cache
def _parsed() -> dict[str, frozenset[str]]:  # quantize/ is parsed once per test session
    return {
        module_name(p): frozenset(imports_of(p.read_text(encoding="utf-8"), module_name(p), p.name == "__init__.py"))
        for p in PKG.rglob("*.py")
    }


def import_sites(source: str, module: str, is_package: bool = False) -> list[tuple[int, frozenset[str], bool]]:
    """(line, the absolute names it brings, whether it runs inside a function) for each import statement that
    runs: those under `if TYPE_CHECKING:` never do, and are left out."""
    out: list[tuple[int, frozenset[str], bool]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    walk(ast.Module(body=[other], type_ignores=[]), in_function)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                names = frozenset(n for _, n in imported_by(child, module, is_package))
                out.append((child.lineno, names, in_function))
            walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    walk(ast.parse(source), False)
    return out


@functools.cache
def _sites() -> dict[str, tuple[tuple[int, frozenset[str], bool], ...]]:
    return {
        module_name(p): tuple(import_sites(p.read_text(encoding="utf-8"), module_name(p), p.name == "__init__.py"))
        for p in PKG.rglob("*.py")
    }


def heavy_modules(top: dict[str, set[str]]) -> set[str]:
    """The quantize modules whose import loads a SLOW library: through their top-level imports, followed through
    every quantize module those import, and through the packages above each (importing `quantize.a.b` runs
    `quantize/a/__init__.py` first)."""
    graph = import_graph(top)
    heavy = set()
    for m in top:
        seen, todo = {m}, [m]
        while todo:
            at = todo.pop()
            parents = {p for i in range(1, at.count(".") + 1) if (p := at.rsplit(".", i)[0]) in top}
            for o in (graph[at] | parents) - seen:
                seen.add(o)
                todo.append(o)
        if any(_under(n, h) for o in seen for n in top[o] for h in SLOW):
            heavy.add(m)
    return heavy


# The API and the CLI import each stage inside the function that runs it, by design: no stage loads a SLOW library
# alone, but together they load pydantic and ~350 modules (`import quantize` ~0.06 s, ~0.5 s with every stage), and a
# refusal answers before any of it.
LAZY_UNCHECKED = (
    "quantize.api",
    "quantize.cli",
)


def needless_lazy_imports(
    sites: dict[str, tuple[tuple[int, frozenset[str], bool], ...]], unchecked: tuple[str, ...] = LAZY_UNCHECKED
) -> list[str]:
    """Function-level imports of the package's own modules that loads no heavy library: such an import belongs at
    the top of its module. Lazy is for a module that loads one (torch, transformers, scipy, ...: SLOW), which is how
    `import quantize` and the CLI's refusals stay light. (Hoisting one cannot make an import cycle while the
    cycle check, which counts function-level imports, passes.)"""
    top = {m: {n for _, names, in_function in s if not in_function for n in names} for m, s in sites.items()}
    heavy = heavy_modules(top)
    found = []
    for mod, module_sites in sorted(sites.items()):
        if mod in unchecked:
            continue
        for line, names, in_function in module_sites:
            targets = {o for n in names if (o := owner(n, top)) and o != mod}
            if in_function and targets and not targets & heavy:
                found.append(
                    f"{mod}:{line} imports {', '.join(sorted(targets))} in a function: it loads no "
                    "heavy library, so it belongs at the top of the module"
                )
    return found


def owner(name: str, files: dict[str, set[str]]) -> str | None:
    """The quantize module a name lives in (`quantize.evaluate.cache.Runtime` -> `quantize.evaluate.cache`); None
    for a library's name. A name taken from the root package (`from quantize import __version__`, `import
    quantize`) is the root package's, which imports the API: from inside the package, an upward arrow (and a
    cycle). `from quantize import cache` is `quantize.cache`'s alone (imports_of leaves the bare root out)."""
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def closure(files: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every name a module imports directly or through the quantize modules it imports."""
    graph = import_graph(files)
    out = {}
    for m in files:
        seen, todo = {m}, [m]
        while todo:
            for o in graph[todo.pop()] - seen:
                seen.add(o)
                todo.append(o)
        out[m] = set().union(*(files[o] for o in seen))
    return out


def import_graph(files: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the quantize modules it imports (function-level imports included)."""
    return {m: {o for n in names if (o := owner(n, files)) and o != m} for m, names in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles as paths a -> b -> ... -> a: one per edge that closes a loop in a depth-first walk in name
    order (so the same graph names the same paths); [] when the graph has none."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: walked
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                found.append([*path[path.index(n) :], n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between top-level packages (`quantize.golden`, `quantize.cache`, ...)."""
    top = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(top(m), set()).update(t for t in map(top, targets) if t != top(m))
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(files: dict[str, set[str]]) -> list[str]:
    return _package_rules(files) + _only_rules(files) + _joins(files) + _engine(files) + _cycles(files)


def _package_rules(files: dict[str, set[str]]) -> list[str]:
    found = []
    for mod, imported in closure(files).items():
        for pkg, banned, why, *allowed in RULES:
            if _under(mod, pkg):
                bans = [b for b in banned if not _under(pkg, b)]  # a package's modules import each other
                bad = [
                    n
                    for n in sorted(imported)
                    if any(_under(n, b) for b in bans) and not (allowed and owner(n, files) in allowed[0])
                ]
                found += [f"{mod} imports {n} (directly or through a module it imports): {why}" for n in bad]
    return found


def _cycles(files: dict[str, set[str]]) -> list[str]:
    """Import cycles between modules, and between packages (golden -> the foundation -> golden is one too)."""
    graph = import_graph(files)
    return [f"import cycle: {' -> '.join(c)}" for g in (graph, packages(graph)) for c in cycles(g)]


def _only_rules(files: dict[str, set[str]]) -> list[str]:
    return [
        f"{mod} imports {what}: {why}"
        for what, allowed, why in ONLY
        for mod, imported in files.items()
        if mod not in allowed and any(_under(name, what) for name in imported)
    ]


def _joins(files: dict[str, set[str]]) -> list[str]:
    """Modules outside flows (and the CLI) that import both evaluation and gates; a stage's renderer (records to
    text) and evaluation's LIGHT modules (a suite, the cache's lookups) do not count: reading a stage's text, or a
    suite and cached records, is not where a model's evaluation meets decisions."""
    found = []
    for mod, imported in files.items():
        if _under(mod, "quantize.flows") or mod == "quantize.cli":
            continue
        stages = {
            p
            for p in ("quantize.evaluate", "quantize.gates")
            if any(_under(n, p) and not _under(n, p + ".render") and owner(n, files) not in LIGHT for n in imported)
        }
        if len(stages) == 2:
            found.append(f"{mod} imports both quantize.evaluate and quantize.gates: only quantize.flows joins them")
    return found


def _engine(files: dict[str, set[str]]) -> list[str]:
    return [
        f"quantize.convert.engine imports {name}: the engine calls the backend protocol, never a backend"
        for name in sorted(files.get("quantize.convert.engine", set()))
        if any(_under(name, b) for b in ENGINE_NEVER)
    ]


def test_packages_depend_one_way():
    files = package_imports()
    assert {"quantize.gates.gate", "quantize.evaluate.score", "quantize.convert.engine", "quantize.flows.gate"} <= set(
        files
    )
    assert violations(files) == []


@pytest.mark.parametrize(
    "planted",
    [
        {"quantize.evaluate.agreement": {"quantize.gates.stats"}},  # what efcadec did
        {"quantize.gates.run": {"quantize.evaluate.score"}},
        {"quantize.gates.run": {"transformers"}},
        {"quantize.report.collect": {"quantize.evaluate.score"}},
        {"quantize.records.run": {"quantize.convert.recipe"}},  # the foundation reaching up into a stage
        {"quantize.records.verdict": {"quantize.records.scores"}},  # a record's module importing another's
        {"quantize.records.sweep": {"quantize.records"}},  # ... or the index, which imports them all
        {"quantize.checkpoint.files": {"quantize.convert.plan"}},
        {"quantize.convert.plan": {"quantize.gates.policy"}},
        {"quantize.golden.freeze": {"quantize.evaluate.score"}},
        {"quantize.cost.bounds": {"torch"}},
        {"quantize.search.run": {"hashlib"}},  # a second hashing helper
        {"quantize.evaluate.score": {"quantize.cache.cache_dir"}},  # a cache path built outside cache.py
        {"quantize.search.run": {"quantize.io.sha256_json"}},  # a cache key built outside cache.py
        {"quantize.search.run": {"quantize.evaluate.agreement", "quantize.gates.policy"}},  # evaluation meets gates
        {"quantize.convert.engine": {"quantize.convert.backends.gptqmodel"}},  # the engine naming a backend
        {"quantize.convert.engine": {"llmcompressor"}},
        {"quantize.convert.engine": {"quantize.convert.backends.llmcompressor.modifiers"}},  # a backend's own parts
        {"quantize.compat.compressed_tensors": {"quantize.checkpoint.qdq"}},  # compat reaching into a stage
        {"quantize.flows.gate": {"quantize.api"}},  # a stage calling the API built over it
        {"quantize.cache": {"quantize.evaluate.cache"}},  # the foundation holding evaluation semantics again
        {"quantize.evaluate.suite": {"quantize.golden.manifest", "quantize.cache.cache_dir"}},
        {"quantize.evaluate.cache": {"quantize.evaluate.score"}},  # the light cache reaching torch through score
        {"quantize.evaluate.suite": {"lm_eval"}},
        {"quantize.gates.gate": {"quantize.evaluate.agreement"}},  # gates may read the light modules, not these
        {"quantize.report.collect": {"quantize.evaluate"}, "quantize.evaluate": {"torch"}},  # a heavy __init__
        {"quantize.golden.manifest": {"quantize.evaluate.suite"}},  # golden below evaluation (and a cycle)
        {"quantize.golden.items": {"quantize.checkpoint.files"}},
        {"quantize.sweep.run": {"quantize.search.run"}},
        {"quantize.cluster.executor": {"quantize.sweep.tasks"}},  # the executor reaching back for the sweep's tasks
        {"quantize.cluster.connect": {"quantize.convert.dtypes"}},  # the bf16 probe taken by the cluster itself
        {"quantize.cluster.resources": {"quantize.evaluate.suite"}},  # gate_gpus reads a suite it is handed
        {"quantize.records": {"quantize.cluster.spec"}},  # the foundation reaching up into the cluster
        {"quantize.flows.gate": {"quantize.sweep.tasks"}},
        {"quantize.compat.lm_eval": {"quantize.golden.prompts"}},
        {"quantize.checkpoint.files": {"quantize.golden.manifest"}},
        {"quantize.cost.bounds": {"quantize.report.render"}},
        {"quantize.convert.engine": {"quantize.cost.bounds"}},
        {"quantize.evaluate.score": {"quantize.cli"}},  # nothing calls the CLI
        {"quantize.api": {"quantize.cli.main"}},
        {"quantize.kinds": {"quantize.golden.items"}},  # kinds is foundation now, listed as such
        {"quantize.io": {"quantize.records.base.write"}},  # io -> records -> io: a cycle inside the foundation
        {"quantize.checkpoint.headers": {"quantize.checkpoint.files.read_config"}},  # headers <-> files
        {"quantize.convert.backends.base": {"quantize.convert.backends.backend_for"}},  # the protocol <-> registry
        {"quantize.convert.provenance": {"quantize.__version__"}},  # the root package, which imports the API
    ],
)
def test_each_rule_catches_a_planted_violation(planted):
    files = package_imports() | planted
    found = violations(files)
    assert any(m in v for v in found for m in planted), f"{planted} broke no rule"


def test_every_module_falls_under_a_rule():
    """A new package (or a new foundation module) cannot escape the rules: each module under quantize/ is inside
    some rule's package, or is the root package or the CLI (which the rules keep everyone else from importing)."""
    files = package_imports()
    uncovered = [m for m in sorted(files) if m not in TOP and not any(_under(m, rule[0]) for rule in RULES)]
    assert uncovered == []
    planted = {"quantize.newstage.run": {"quantize.errors"}}
    assert [m for m in planted if not any(_under(m, rule[0]) for rule in RULES)] == ["quantize.newstage.run"]


def test_no_import_cycle_between_modules_or_packages():
    """Function-level imports count: a cycle hidden in a function is one (accounting <-> files was)."""
    graph = import_graph(package_imports())
    assert cycles(graph) == []
    assert cycles(packages(graph)) == []


def test_a_cycle_is_reported_as_its_path():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    found = _cycles(package_imports() | {"quantize.io": {"quantize.records.base.write"}})
    assert "import cycle: quantize.io -> quantize.records.base -> quantize.io" in found
    # a package cycle whose modules form none: golden -> the foundation's cache -> golden (what suite.py made)
    planted = {"quantize.golden.freeze": {"quantize.cache.cache_dir"}, "quantize.cache": {"quantize.golden.manifest"}}
    assert "import cycle: quantize.cache -> quantize.golden -> quantize.cache" in _cycles(package_imports() | planted)


def test_rendering_both_stages_is_not_joining_them():
    """A module that imports only the two stages' renderers (as cli does) renders records; it decides nothing."""
    assert not violations(
        package_imports() | {"quantize.search.render": {"quantize.evaluate.render", "quantize.gates.render"}}
    )


def test_the_walk_follows_imports_through_other_modules():
    """gates -> a helper -> transformers is as wrong as gates -> transformers."""
    assert violations({"quantize.gates.gate": {"quantize.helper"}, "quantize.helper": {"transformers"}})


def test_function_level_imports_and_module_attributes_are_seen():
    src = (
        "from quantize import cache\n\n"
        "def f():\n    from quantize.evaluate.score import score\n    return score, cache.cache_dir()\n"
    )
    found = imports_of(src, "quantize.gates.probe")
    assert {"quantize.evaluate.score", "quantize.cache.cache_dir"} <= found


def test_relative_imports_resolve_against_the_package():
    assert "quantize.gates.policy" in imports_of("from .policy import Policy\n", "quantize.gates.gate")
    assert "quantize.gates.policy" in imports_of("from .policy import Policy\n", "quantize.gates", is_package=True)


def test_the_root_package_is_imported_by_a_name_taken_from_it():
    """`from quantize import __version__` (what convert/provenance.py once did) runs quantize/__init__.py, which
    imports the API: from inside the package, that is an arrow up to the API and a cycle through it."""
    files = package_imports()
    planted = imports_of("def f():\n    from quantize import __version__\n", "quantize.convert.provenance")
    assert owner("quantize.__version__", files) == "quantize"
    assert owner("quantize.cache", files) == "quantize.cache"
    assert "quantize" not in imports_of("from quantize import cache\n", "quantize.gates.probe")  # a module alone
    found = violations(files | {"quantize.convert.provenance": files["quantize.convert.provenance"] | planted})
    assert any(v.startswith("quantize.convert.provenance imports quantize.api") for v in found)
    assert any(v.startswith("import cycle:") and "quantize.convert.provenance" in v for v in found)


def test_a_cycle_through_a_function_level_import_is_one():
    """The cycle check reads the function-level imports: io importing records' base inside a function is a cycle
    (records' base imports io)."""
    source = (PKG / "io.py").read_text(encoding="utf-8") + "\n\ndef f():\n    from quantize.records.base import write\n"
    found = _cycles(package_imports() | {"quantize.io": imports_of(source, "quantize.io")})
    assert "import cycle: quantize.io -> quantize.records.base -> quantize.io" in found


def test_an_own_module_imported_in_a_function_loads_a_slow_library():
    """A function-level import of a quantize module is lazy for a reason: the module loads torch, scipy or another
    SLOW library at import. One that loads none belongs at the top of its module (issue #56)."""
    assert needless_lazy_imports(_sites()) == []


def test_a_needless_lazy_import_is_caught():
    light = "def f():\n    from quantize.io import sha256_json\n"
    heavy = (
        "def f():\n    from quantize.evaluate.lm import PrefixLM\n"
        "    from quantize.evaluate.llamacpp import LlamaCppLM\n"
    )
    hidden = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from quantize.io import sha256_json\n"

    def planted(module: str, source: str) -> list[str]:
        return needless_lazy_imports(_sites() | {module: tuple(import_sites(source, module))})

    assert planted("quantize.sweep.plan", light) == [
        "quantize.sweep.plan:2 imports quantize.io in a function: it loads no heavy library, so it belongs at the "
        "top of the module"
    ]
    assert planted("quantize.sweep.plan", heavy) == []  # lm loads torch; llamacpp llama_cpp
    assert planted("quantize.sweep.plan", hidden) == []  # never runs
    assert planted(LAZY_UNCHECKED[0], light) == []  # not checked yet
