"""Golden sets as text: what `golden verify` checked and what `golden new` / `golden freeze` wrote."""

from __future__ import annotations

from pathlib import Path

from quantize.golden.manifest import GoldenSet, Manifest


def verified_text(g: GoldenSet) -> str:
    files = g.manifest.files
    counts = ", ".join(f"{Path(n).stem} {f.items}" for n, f in sorted(files.items()) if f.items is not None)
    return f"{g.path}: verified {len(files)} files ({counts}); manifest sha256 {g.manifest_sha256[:16]}"


def written_text(out: str | Path, m: Manifest) -> str:
    tasks = ", ".join(
        f"{t} ({e.output_type}, {m.files[e.data].items} items"
        + (f", {len(e.fewshot_ids)} few-shot" if e.fewshot else "")
        + ")"
        for t, e in (m.tasks or {}).items()
    )
    return (
        f"{out}: wrote golden set {m.name}/{m.version}: {tasks}\n"
        f"score it with a suite whose `golden:` is {out} (see docs/golden-sets.md)"
    )


def built_text(m: Manifest) -> str:
    """Each file of a built core version with its item count and the start of its sha256."""
    return "\n".join(f"{name}: {f.items if f.items is not None else ''} {f.sha256[:12]}" for name, f in m.files.items())
