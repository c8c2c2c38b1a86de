"""Evaluation suites (evaluate/*.yaml): which golden set, which tasks, how to run lm-eval.

`open_suite` loads a suite once, verifies its golden set once and checks its tasks: scoring,
agreement, the gate and the report all take the `OpenSuite` it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantize.config import beside_repo, load_yaml
from quantize.errors import UsageError
from quantize.golden.manifest import GoldenSet, verify
from quantize.io import sha256_json

# the device kinds a suite may name (the validator below); scores are cached per kind (quantize/evaluate/cache.py)
DEVICE_KINDS = ("cpu", "cuda", "xpu", "npu", "mps")


def named_tasks(tasks: list[str] | None, leave_out: str) -> list[str] | None:
    """A suite's task list: None (left out) or a non-empty list. An empty list would read as "every task" (the
    default, which it falls back to) while keying other cached scores than leaving the field out: refused."""
    if tasks is not None and not tasks:
        raise ValueError(f"an empty list names no task; {leave_out}, or list the tasks")
    return tasks


def device_kind(device: str) -> str:
    """A device without its index: "cuda:1" -> "cuda"."""
    return device.split(":")[0]


class Backend(str, Enum):
    quantize = "quantize"  # our lm-eval model: each context computed once, items independent of their batch
    hf = "hf"  # lm-eval's stock HF backend (HFLM)
    vllm = "vllm"
    llamacpp = "llamacpp"  # llama.cpp (evaluate/llamacpp.py): GGUF checkpoints only, and their default anyway


class VLLM(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.8, gt=0, le=1)


class LlamaCppSettings(BaseModel):
    """How llama.cpp scores a GGUF (quantize/evaluate/llamacpp.py): fixed, so an item's numbers are reproducible,
    and recorded in the provenance and the cache key."""

    model_config = ConfigDict(extra="forbid")

    n_threads: int = Field(2, ge=1, le=1024, description="CPU threads llama.cpp decodes with")
    n_batch: int = Field(512, ge=1, le=65536, description="tokens decoded per call: where a sequence's chunks fall")


class Agreement(BaseModel):
    """Token-distribution agreement with the baseline, on the first `per_task` items of each task."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] | None = Field(None, description="default: the tasks the suite scores")
    per_task: int = Field(40, ge=1)
    top_k: int = Field(20, ge=1, le=1000)

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, tasks: list[str] | None) -> list[str] | None:
        return named_tasks(tasks, "leave `agreement.tasks` out to measure agreement on the tasks the suite scores")


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    golden: str = Field(
        description="golden-set version folder, e.g. golden/core/v1 (relative to the suite file's repo)"
    )
    tasks: list[str] | None = Field(None, description="tasks to score; default: all tasks of the golden set")
    subset: str | None = Field(None, description="'smoke' scores only the manifest's fixed smoke ids")
    batch_size: int = Field(16, ge=1, le=4096)
    seed: int = Field(0, ge=0, lt=2**32, description="lm-eval's seeds (numpy's range: 0 to 2**32 - 1)")
    backend: Backend = Backend.quantize
    dtype: str = Field(
        "auto",
        pattern=r"^(auto|float32|float16|bfloat16|float64)$",
        description="auto: float32 on a CPU, the checkpoint's dtype on an accelerator; else float32, float16, "
        "bfloat16 or float64",
    )
    device: str = Field("auto", description="auto: the accelerator torch finds (cuda, xpu, mps, ...), else cpu")
    max_length: int | None = Field(None, ge=16, description="context window; default: the model's")
    vllm: VLLM | None = None
    llamacpp: LlamaCppSettings | None = Field(None, description="a GGUF's engine settings; default: the section's own")
    agreement: Agreement = Field(default_factory=Agreement)

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, tasks: list[str] | None) -> list[str] | None:
        return named_tasks(tasks, "leave `tasks` out to score every task of the golden set")

    @field_validator("device")
    @classmethod
    def _device(cls, d: str) -> str:
        # an index as torch parses one (no sign, no leading zero) and of at most 3 digits: torch holds an index in
        # 8 bits ("cuda:99999999999999999999" does not parse, "cuda:128" wraps to -128); whether this machine has
        # the device is checked where a model is loaded on it (checkpoint/loader.usable_device)
        if not re.fullmatch(r"auto|cpu|mps|(cuda|xpu|npu)(:(0|[1-9][0-9]{0,2}))?", d):
            raise ValueError(
                f"device must be auto, cpu, mps, or cuda/xpu/npu with an optional :index (0 to 999, no leading "
                f"zero), got {d!r}"
            )
        return d

    @model_validator(mode="after")
    def _check(self) -> Suite:
        if self.subset not in (None, "smoke"):
            raise ValueError(f"subset must be empty or 'smoke', got {self.subset!r}")
        if self.vllm is not None and self.backend is not Backend.vllm:
            raise ValueError("a `vllm:` section needs `backend: vllm`; remove it or switch the backend")
        return self

    def model_dtype(self, device: str) -> str:
        """The dtype a checkpoint is loaded in to be scored or compared: the suite's, or on "auto"
        float32 on a CPU and the checkpoint's own ("auto") on an accelerator."""
        if self.dtype != "auto":
            return self.dtype
        return "float32" if device == "cpu" else "auto"

    def settings(self) -> dict[str, Any]:
        """Everything in the suite that can change a score: part of the cache key and of the provenance."""
        # the golden set is keyed by its manifest hash; an absent `llamacpp:` is left out, so the suites written before
        # it keep their hash (and their cached scores)
        unset = {"llamacpp"} if self.llamacpp is None else set()
        return self.model_dump(mode="json", exclude={"name", "golden", *unset})


def load_suite(path: str | Path) -> tuple[Suite, str]:
    """Read and validate a suite. Returns it and the hash of its score-changing settings."""
    suite, _ = load_yaml(path, Suite, "suite", "the shipped suites are in evaluate/*.yaml")
    if suite.name is None:
        suite.name = Path(path).stem
    suite.golden = beside_repo(path, suite.golden)
    return suite, sha256_json(suite.settings())


@dataclass(frozen=True)
class OpenSuite:
    """A validated suite with its verified golden set: what every scorer and reader of scores takes."""

    path: str
    suite: Suite
    sha256: str  # of the score-changing settings
    golden: GoldenSet

    @property
    def tasks(self) -> list[str]:
        return self.suite.tasks or self.golden.tasks

    @property
    def agreement_tasks(self) -> list[str]:
        """The tasks agreement is measured on: the suite's `agreement.tasks`, else the tasks it scores."""
        return self.suite.agreement.tasks or self.tasks


def open_suite(path: str | Path) -> OpenSuite:
    """Load a suite, verify its golden set and check that the set has the suite's tasks."""
    suite, sha = load_suite(path)
    golden = verify(suite.golden)
    for what, names in (("tasks", suite.tasks), ("agreement.tasks", suite.agreement.tasks)):
        unknown = sorted(set(names or []) - set(golden.tasks))
        if unknown:
            raise UsageError(
                f"suite {path} names {what} the golden set lacks: {', '.join(unknown)}; "
                f"it has {', '.join(golden.tasks)}"
            )
    return OpenSuite(str(path), suite, sha, golden)
