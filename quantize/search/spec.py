"""Search recipes (recipes/search-*.yaml): what `quantize search` may choose per layer group, and its budget.

    name: search-w4-w8
    base:                        # the method every quantized layer group gets (a recipe, inline; or method gguf:
                                 # llama.cpp's tensor types as options, recipes/search-gguf.yaml)
      method: rtn
      scheme: W4A16
      group_size: 128
      calibration: null
    options: [W4A16, W8A16, keep]  # per layer group: the base scheme, other weight-only schemes, 16 bits
    unit: block-part             # layer groups: attention and MLP of each block (or `layer`: every Linear)
    budget: 7.5                  # bits per weight of the whole model (true bytes × 8 / source parameters)
    policy: gates/ci.yaml
    measure: {per_task: 8, holdout_per_task: 24}
    max_gates: 3
    max_parallel: 1              # tries gated at once a round (on Ray, as a sweep's tasks; cluster:, resources:)

Validated like a recipe (pydantic, `extra="forbid"`): every error names the field and what to do, before
any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantize.cluster.spec import Cluster, TaskResources
from quantize.config import beside_repo, load_yaml
from quantize.convert.gguf import IMATRIX, block_size, default_tensor_type
from quantize.convert.recipe import GGUF_TYPE_NAME, WEIGHT_ONLY_INT, GGUFRecipe, GPTQRecipe, RTNRecipe, Scheme
from quantize.names import PathPart, PathText, checked

INT_NAMES = tuple(s.value.lower() for s in Scheme)  # scheme names keep their own spelling


class Measure(BaseModel):
    """How much to spend measuring: agreement items per golden task for the sensitivities, and further
    held-out items per task to check the chosen allocation against random and heuristic ones."""

    model_config = ConfigDict(extra="forbid")

    per_task: int = Field(8, ge=1, le=1000)
    holdout_per_task: int = Field(24, ge=0, le=1000)
    top_k: int = Field(20, ge=1, le=1000)
    random_allocations: int = Field(3, ge=0, le=100, description="random allocations of equal bytes to compare")


class SearchRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: PathPart | None = Field(None, description="the output folder's name (outputs/<name>); default: the file's")
    description: str | None = None
    model: str | None = Field(None, description="local checkpoint folder; empty = the embedded default model")
    base: RTNRecipe | GPTQRecipe | GGUFRecipe = Field(
        discriminator="method", description="the method and settings of every quantized layer group"
    )
    options: list[Annotated[Scheme | str, Field(union_mode="left_to_right")]] = Field(
        default_factory=lambda: [Scheme.W4A16, Scheme.W8A16, "keep"], min_length=2
    )
    unit: Literal["block-part", "layer"] = "block-part"
    budget: float | list[float] = Field(description="bits per weight of the whole model, or a list of budgets")
    policy: str = Field(description="the gate policy every tried allocation must pass, e.g. gates/ci.yaml")
    measure: Measure = Field(default_factory=Measure)
    max_gates: int = Field(3, ge=1, le=50, description="allocations gated at most, cheapest first")
    max_parallel: int = Field(
        1, ge=1, le=64, description="tries converted and gated at once a round, on Ray; 1: one after the other here"
    )
    cluster: Cluster = Field(default_factory=Cluster, description="with max_parallel > 1: where (as a sweep's)")
    resources: TaskResources = Field(default_factory=TaskResources, description="with max_parallel > 1: per task")
    output: PathText | None = Field(None, description="default outputs/<name>")

    @field_validator("options", mode="before")
    @classmethod
    def _spelled(cls, opts: object) -> object:
        """A GGUF option's spelling, as a gguf recipe's type is spelled (upper case): q6_k is Q6_K."""
        if not isinstance(opts, list):
            return opts
        return [
            o.strip().upper() if isinstance(o, str) and o.strip().lower() not in ("keep", *INT_NAMES) else o
            for o in opts
        ]

    @field_validator("options")
    @classmethod
    def _options(cls, opts: list[Scheme | str]) -> list[Scheme | str]:
        if len(set(opts)) != len(opts):
            raise ValueError(f"options repeat a choice: {[getattr(o, 'value', o) for o in opts]}")
        return opts

    @field_validator("budget", mode="before")
    @classmethod
    def _a_number(cls, b: object) -> object:
        """A budget is a number: pydantic reads `true` as 1.0 bits per weight (a review)."""
        if any(isinstance(x, bool) for x in (b if isinstance(b, list) else [b])):
            raise ValueError(f"budget {b!r} is not a number of bits per weight; give e.g. 7.5 (between 1 and 32)")
        return b

    @field_validator("budget")
    @classmethod
    def _budget(cls, b: float | list[float]) -> float | list[float]:
        for x in b if isinstance(b, list) else [b]:
            if not 1 <= x <= 32:
                raise ValueError(f"budget {x} is not a plausible bits per weight; give e.g. 7.5 (between 1 and 32)")
        if isinstance(b, list) and not b:
            raise ValueError("budget is an empty list; give one number or a list of them")
        return b

    @model_validator(mode="after")
    def _base(self) -> SearchRecipe:
        if isinstance(self.base, GGUFRecipe):
            return self._gguf()
        bad = [o for o in self.options if o != "keep" and o not in WEIGHT_ONLY_INT]
        if bad:
            raise ValueError(
                f"options must be weight-only int schemes (W3A16, W4A16, W8A16) or keep; got {bad[0]}: one "
                "checkpoint mixes weight-only int layers only (a `method: gguf` base takes llama.cpp's tensor types)"
            )
        if self.base.scheme not in self.options:
            raise ValueError(
                f"the base scheme {self.base.scheme.value} must be one of the options "
                f"{[getattr(o, 'value', o) for o in self.options]}"
            )
        if not self.base.symmetric:
            raise ValueError("the search counts bytes of symmetric schemes; set base.symmetric: true")
        if self.base.overrides:
            raise ValueError("base.overrides is what the search writes; remove it from the search recipe")
        if self.base.method.value == "gptq":
            raise ValueError(
                "the search measures each layer group's damage by quantizing it alone, in place; that is exact "
                "for rtn (no calibration). For gptq it would take one calibration run per layer group; use "
                "method rtn in `base:`"
            )
        return self

    def _gguf(self) -> SearchRecipe:
        """A GGUF base: options are ggml tensor types (checked against llama.cpp in preflight) or keep, the base
        file type's own tensor type among them; no tensor_types of its own. Its `calibration:`, if any, gives the
        importance matrix every file of the search is quantized with (search/gguf.py)."""
        bad = [o for o in self.options if o != "keep" and (isinstance(o, Scheme) or not GGUF_TYPE_NAME.fullmatch(o))]
        if bad:
            raise ValueError(
                f"options of a `method: gguf` base are llama.cpp's tensor types (Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS, "
                f"...) or keep; got {getattr(bad[0], 'value', bad[0])}"
            )
        own = default_tensor_type(self.base.type)
        if block_size(own) == 1:
            raise ValueError(
                f"base type {self.base.type} is a float file type, and llama.cpp's quantizer applies per-tensor types "
                "(the options a search tries) only in a quantized one: choose a quantized base `type:` (e.g. Q4_K_M)"
            )
        if own not in self.options:
            raise ValueError(
                f"base type {self.base.type} gives its tensors {own}, which must be one of the options "
                f"{[getattr(o, 'value', o) for o in self.options]}: add {own}"
            )
        if self.base.tensor_types:
            raise ValueError("base.tensor_types is what the search writes; remove it from the search recipe")
        if self.base.calibration is None and (needs := sorted({o for o in self.options if o in IMATRIX})):
            raise ValueError(
                f"options {needs}: llama.cpp quantizes a tensor to {'this type' if len(needs) == 1 else 'these types'} "
                "only with an importance matrix; give the base a `calibration:` section, or choose other options"
            )
        return self

    @property
    def budgets(self) -> list[float]:
        return sorted(self.budget) if isinstance(self.budget, list) else [self.budget]


def load_search(path: str | Path) -> tuple[SearchRecipe, str]:
    spec, sha = load_yaml(path, SearchRecipe, "search recipe", "see recipes/search-w4-w8.yaml")
    if spec.name is None:
        spec.name = checked(
            Path(path).stem, f"search recipe {path}: its name (the file's, as it sets no `name:`)", "set `name:` in it"
        )
    spec.policy = beside_repo(path, spec.policy)
    return spec, sha
