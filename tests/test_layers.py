"""Packages depend one way (DESIGN.md, "Layers"): a walk over every import in quantize/, function-level
imports included, so a shortcut added later fails here rather than in review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "quantize"
MODEL_LOADING = (
    "torch",
    "transformers",
    "lm_eval",
    "llmcompressor",
    "quantize.checkpoint.loader",
    "quantize.evaluate",
    "quantize.convert.engine",
    "quantize.convert.checks",
)

# (package, imports it must never make, why)
RULES = [
    (
        "quantize.evaluate",
        ("quantize.gates", "quantize.report", "quantize.flows.gate"),
        "evaluation scores; it does not decide",
    ),
    (
        "quantize.gates",
        MODEL_LOADING + ("quantize.report", "quantize.flows.gate"),
        "gates decide from records, never load a model",
    ),
    ("quantize.report", MODEL_LOADING + ("quantize.flows.gate",), "the report reads records, it scores nothing"),
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
    ("quantize.cache", MODEL_LOADING[:4] + ("quantize.evaluate", "quantize.gates"), "the cache only finds files"),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module a file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative import: resolve against the package
                pkg = module_name(path).split(".")[: -node.level]
                base = ".".join([*pkg, node.module])
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def closure(files: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every name a module imports directly or through the quantize modules it imports."""

    def own(name: str) -> str | None:  # the quantize module a name lives in
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    out = {m: set(names) for m, names in files.items()}
    changed = True
    while changed:
        changed = False
        for m, names in out.items():
            more = set().union(*(out[o] for n in list(names) if (o := own(n)) and o != m)) - names
            if more:
                names |= more
                changed = True
    return out


def violations(files: dict[str, set[str]]) -> list[str]:
    found = []
    for pkg, banned, why in RULES:
        for mod, imported in closure(files).items():
            if mod == pkg or mod.startswith(pkg + "."):
                for name in sorted(imported):
                    if any(name == b or name.startswith(b + ".") for b in banned):
                        found.append(f"{mod} imports {name} (directly or through a module it imports): {why}")
    return found


def test_packages_depend_one_way():
    files = {module_name(p): imports_of(p) for p in PKG.rglob("*.py")}
    assert "quantize.gates.gate" in files and "quantize.evaluate.score" in files
    assert violations(files) == []


@pytest.mark.parametrize(
    "mod,name",
    [
        ("quantize.evaluate.agreement", "quantize.gates.stats"),  # what efcadec did
        ("quantize.gates.run", "quantize.evaluate.score"),
        ("quantize.gates.run", "transformers"),
        ("quantize.report.collect", "quantize.evaluate.score"),
    ],
)
def test_the_walk_catches_a_wrong_import(mod, name):
    assert violations({mod: {name}})


def test_the_walk_follows_imports_through_other_modules():
    """gates -> a helper -> transformers is as wrong as gates -> transformers."""
    assert violations({"quantize.gates.gate": {"quantize.helper"}, "quantize.helper": {"transformers"}})


def test_function_level_imports_are_seen(tmp_path):
    f = PKG / "gates" / "_probe_for_test.py"
    try:
        f.write_text("def f():\n    from quantize.evaluate.score import score\n    return score\n")
        assert "quantize.evaluate.score" in imports_of(f)
    finally:
        f.unlink()
