"""llm-compressor: `oneshot` with the modifiers our recipe compiles to (modifiers.py), or a verbatim `stages:`
section; writes the compressed-tensors format. Beside it in this package: modifiers.py (a recipe and its layer plan
compiled to llm-compressor's modifiers), mappings.py (AWQ's and SmoothQuant's mappings, llm-compressor's choice,
checked on the meta model before a load), kvcache.py (a quantized KV cache the library cannot hold on this model,
refused before a load) and runtime.py (what its calibration needs on a torch without an
accelerator)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from quantize.checkpoint.architecture import mtp_of
from quantize.checkpoint.files import SAFE_INDEX, SAFE_WEIGHTS, identity_view, read_config, safetensors_files
from quantize.checkpoint.headers import FLOATS
from quantize.checkpoint.loader import load_model
from quantize.compat.compressed_tensors import seq_length_without_a_cache
from quantize.compat.llmcompressor import (
    every_module_calibrated,
    fx_wraps_dropped,
    global_scales_shared,
    linearize,
    model_free_ptq_pt,
    mtp_copied,
    weights_observed,
)
from quantize.compat.transformers import saved_names
from quantize.convert.backends.base import CalibrationDtype, Job
from quantize.convert.backends.llmcompressor.kvcache import check_kv_cache
from quantize.convert.backends.llmcompressor.mappings import check_mappings
from quantize.convert.backends.llmcompressor.modifiers import compile_modifiers
from quantize.convert.backends.llmcompressor.runtime import cpu_safe_calibration
from quantize.convert.plan import LayerPlan, checkpoint_name, expert_checkpoint_names, per_expert_loader, renamings
from quantize.convert.recipe import WEIGHT_ONLY_INT, Method, Recipe, Scheme
from quantize.errors import RuntimeFailure, UsageError
from quantize.records import ExpertRouting

# model_free_ptq's schemes: compressed-tensors presets whose activations (if any) are dynamic, so nothing is
# calibrated, plus the int weight-only schemes it rounds to nearest (static_minmax, the same scales as oneshot's)
STREAMABLE = frozenset(
    {
        (Method.fp8, Scheme.FP8_DYNAMIC),
        *((Method.rtn, s) for s in (Scheme.FP8_DYNAMIC, Scheme.FP8_BLOCK, Scheme.NVFP4A16, Scheme.MXFP4A16)),
        *((Method.rtn, s) for s in (Scheme.MXFP4, Scheme.W4AFP8, Scheme.W8A8)),
        *((Method.rtn, s) for s in WEIGHT_ONLY_INT),
    }
)


class LLMCompressorBackend:
    name = "llmcompressor"
    packages: tuple[str, ...] = ()
    install = "they are in quantize's core environment: install quantize with its dependencies"
    library = "llmcompressor"
    credit = "llm-compressor"
    card_tags = ("compressed-tensors", "llm-compressor")
    formats: ClassVar[dict[str, str]] = {"*": "compressed-tensors format"}
    load_note: ClassVar[dict[str, str]] = {"*": "(compressed-tensors installed)"}
    schemes: ClassVar[dict[Method, frozenset[Scheme]] | None] = None  # every method and scheme a recipe allows
    kv_cache: ClassVar[bool] = True  # llm-compressor's kv_cache_scheme
    streams: ClassVar[frozenset[tuple[Method, Scheme]]] = STREAMABLE  # through model_free_ptq
    offloads: ClassVar[bool] = True  # its sequential pipeline over compressed-tensors' disk offload
    linearizes_experts: ClassVar[bool] = True  # its own linearize_moe, as oneshot runs it
    file_to_file: ClassVar[bool] = False  # it converts a loaded model
    calibration_dtypes: ClassVar[dict[Method, CalibrationDtype]] = {
        Method.awq: CalibrationDtype(
            (), "float32", "AWQ calibrates in float32 (its grid search keeps finite losses there); the default"
        )
    }

    @classmethod
    def check(cls, recipe: Recipe) -> str | None:
        """Nothing beyond the registry's checks: it runs every recipe the schema admits."""
        return None

    def prepare(self, recipe: Recipe, plan: LayerPlan) -> Any:
        return compile_modifiers(recipe, plan)

    def load(self, model_dir: Path, recipe: Recipe, dtype: Any, offload_dir: Path | None = None) -> tuple[Any, Any]:

        check_mappings(model_dir, recipe)  # AWQ/SmoothQuant whose mappings cannot apply: refused before the load
        check_kv_cache(model_dir, recipe)  # a KV cache compressed-tensors cannot quantize here: refused before it

        return load_model(model_dir, recipe.trust_remote_code, dtype=dtype or "auto", offload_dir=offload_dir)

    def quantize(self, job: Job) -> tuple[Any, Any]:
        """`oneshot` on our packed calibration tokens (none for data-free schemes). An MoE model's fused experts
        become per-expert Linear layers first (llm-compressor's `linearize_moe`, as the layer plan assumed), and
        with calibration data every expert sees every calibration token (`moe_calibrate_all_experts`), while
        hooks count the tokens the router sent to each expert (`routing`)."""
        recipe, calib = job.recipe, job.calib
        self._routing: list[ExpertRouting] = []
        # weights_observed: GPTQ observes the weight of a Linear its tracer does not reach (Gemma 4's
        # per_layer_model_projection) before compressing it, instead of stopping on "No statistics available";
        # fx_wraps_dropped: the traced forwards' namespaces, which hold the model, leave torch.fx's table after;
        # global_scales_shared: NVFP4 global scales shared across every pair of layers vLLM merges (Qwen3.5's);
        # every_module_calibrated: QuantizationModifier's scales for a Linear its tracer does not reach, too;
        # seq_length_without_a_cache: a quantized KV cache answers get_seq_length where the model reads it (Llama 4)
        with (
            seq_length_without_a_cache(),
            cpu_safe_calibration(),
            weights_observed(),
            every_module_calibrated(),
            fx_wraps_dropped(),
            global_scales_shared(),
        ):
            from datasets import Dataset
            from llmcompressor import oneshot
            from llmcompressor.modeling.moe.linearize import get_linearized_moes

            linearize(job.model)
            counter = _RoutingCounter(get_linearized_moes(job.model)) if calib is not None else None

            kwargs: dict[str, Any] = {}
            if calib is not None:
                ids = calib.input_ids.tolist()
                kwargs = dict(
                    dataset=Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(ids[0])] * len(ids)}),
                    num_calibration_samples=len(ids),
                    max_seq_length=len(ids[0]),
                    shuffle_calibration_samples=False,
                )
            if job.offloaded:  # one decoder layer at a time in memory, the others on disk
                kwargs["pipeline"] = "sequential"
            try:
                ran = (
                    oneshot(
                        model=job.model,
                        processor=job.tok,
                        recipe=job.prepared,
                        moe_calibrate_all_experts=True,
                        **kwargs,
                    )
                    or job.model
                )
                return ran, serialized(job.prepared)
            except (ValueError, KeyError) as e:
                if recipe.method is Method.llmcompressor:
                    raise UsageError(f"llm-compressor rejected the verbatim `stages:` recipe: {e}") from None
                raise RuntimeFailure(f"llm-compressor failed: {type(e).__name__}: {e}") from e
            finally:
                if counter is not None:
                    self._routing = counter.done()

    def routing(self) -> list[ExpertRouting]:
        """Per MoE layer, the calibration tokens the router sent to each expert during the last `quantize`
        (empty for a dense model or a data-free recipe)."""
        return getattr(self, "_routing", [])

    def save(self, model: Any, folder: Path) -> None:
        """save_pretrained, compressed; an MoE's per-expert layers then renamed to the names its family's
        checkpoints use where llm-compressor's differ (Mixtral's w1/w3/w2: plan.expert_checkpoint_names), so
        transformers 5 merges them into its fused experts on reload, and their `re:` targets written to match the
        module by both its names (transformers' `.mlp.`, the checkpoint's and vLLM's `.block_sparse_moe.`); every
        other target naming a module transformers renames on load, too (_targets_by_both_names). The experts of a
        family transformers reads only fused (gpt-oss, Granite 4) are fused again where none is quantized, and stay
        per expert where one is (plan._fused_only). A shard
        of the source's MTP module that llm-compressor's save adds beside a single model.safetensors is made one
        layout with it (_single_file_indexed)."""
        from llmcompressor.modeling.moe.linearize import get_linearized_moes, repack_moe

        moes = get_linearized_moes(model)
        if moes and not per_expert_loader(model.config.model_type) and not _quantized(moes):
            repack_moe(model)  # experts at 16 bits (plan._fused_only), fused again as the family's loader reads
        model.save_pretrained(folder, save_compressed=True)
        _single_file_indexed(folder)
        if names := expert_checkpoint_names(model.config.model_type):
            _rename_experts(folder, names, renamings(model.config.model_type))
        _targets_by_both_names(folder, model)

    def stream(self, model_dir: Path, folder: Path, prepared: Any, model: Any, held: dict[str, str]) -> str:
        """A data-free recipe shard by shard: `model_free_ptq` with the same config groups (the layer plan's
        names as targets) and ignore list as `oneshot`, each tensor cast first to the dtype the in-memory path's load
        holds it in (`held`: _AsLoaded), so the stored tensors are the same bytes. Each shard is
        written with save_pretrained's header metadata ({"format": "pt"}) and config.json as save_pretrained writes
        it (sorted keys, the empty sparsity_config compressed-tensors adds, and the ignore list its save writes:
        _ignore_as_saved), so a single-file output's model.safetensors and config.json are byte-identical to the
        in-memory path's (tests/convert/test_streaming.py), and recipe.yaml as save_pretrained writes it; a source of
        one file gives one file and no shard index (model_free_ptq writes one anyway; without it the folder is laid
        out as the in-memory path's). The source's multi-token-prediction tensors, which model_free_ptq copies
        whatever they are, are kept only where the in-memory path's save copies them (_mtp_as_saved). `model` is the
        meta-device model of the layer plan. Returns what ran (as `quantize` does), serialized before
        model_free_ptq, which sets the format on the config groups it is given."""
        from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus
        from transformers.utils import SAFE_WEIGHTS_INDEX_NAME

        ran = serialized(prepared)
        (modifier,) = prepared  # streamable recipes compile to one QuantizationModifier (STREAMABLE)
        config = QuantizationConfig(
            config_groups=modifier.config_groups,
            ignore=list(modifier.ignore),
            quantization_status=QuantizationStatus.INITIALIZED,
        )
        ignore = _ignore_as_saved(model, config)
        try:
            # model_free_ptq copies every other file of the folder it reads into the output (recursively, through
            # links: a link to a secret arrived as a file holding it, .git was copied, a FIFO was exit 3): it reads
            # a view holding only the weights and the files the identity covers
            with tempfile.TemporaryDirectory(prefix="quantize-stream-") as tmp:
                view = identity_view(model_dir, Path(tmp) / "source")
                # every shard with save_pretrained's header metadata, its tensors cast as the in-memory load holds them
                model_free_ptq_pt(view, folder, config, _AsLoaded(held))
        except (ValueError, KeyError, RuntimeError) as e:
            raise RuntimeFailure(
                f"llm-compressor's model_free_ptq failed: {type(e).__name__}: {str(e)[:500]}. The source passed "
                "quantize's checks before it (headers, shard index and config.json), so this is quantize's failure "
                "or the environment's, not your input's: nothing was kept. Report it with the recipe and the "
                "model's config.json"
            ) from e
        if not (model_dir / SAFE_WEIGHTS_INDEX_NAME).is_file():  # one file in, one file out: no index beside it
            (folder / SAFE_WEIGHTS_INDEX_NAME).unlink(missing_ok=True)
        cfg = read_config(folder)
        cfg["quantization_config"].setdefault("sparsity_config", {})
        cfg["quantization_config"]["ignore"] = ignore
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        (folder / "recipe.yaml").write_text(ran)
        _mtp_as_saved(model_dir, folder, model.config)
        return ran

    def release(self) -> None:
        """llm-compressor's session holds the quantized model too."""
        import gc

        from llmcompressor.core import reset_session

        reset_session()
        gc.collect()


def _quantized(moes: list[tuple[str, Any]]) -> bool:
    """Whether a quantization scheme sits on any expert of the linearized MoE modules (written per expert then:
    plan._fused_only)."""
    return any(getattr(m, "quantization_scheme", None) is not None for _, moe in moes for m in moe.modules())


class _AsLoaded:
    """A compressed-tensors Converter (the protocol of model_free_ptq's `converter`, which it runs on each shard's
    tensors before its own quantization): every floating tensor of 16 bits and up cast to the dtype the in-memory
    path's load holds it in (`held`: dtypes.held_dtypes, keyed by stored name; a tensor it does not name is left as
    stored). That load (from_pretrained in the checkpoint's dtype) rounds a weight a bf16 checkpoint stores in
    float32 to bf16 and quantizes that; model_free_ptq quantized the float32 values, so the packed values and scales
    could differ in the last bit (issue 57). Names, dependencies and the quantization config are left as they are.
    One tensor is replaced at a time, so a shard is held once plus one cast tensor."""

    def __init__(self, held: dict[str, str]):
        self.held = held

    def process(self, tensors: dict[str, Any]) -> dict[str, Any]:
        import torch

        for name in list(tensors):
            t, target = tensors[name], self.held.get(name)
            if target in FLOATS.values() and str(t.dtype).removeprefix("torch.") in FLOATS.values():
                tensors[name] = t.to(getattr(torch, target))  # a no-op where it already is
        return tensors

    def validate(self, tensors: dict[str, Any]) -> dict[str, Any]:
        return self.process(tensors)  # a dtype cast runs on the meta device model_free_ptq validates on

    def update_config(self, config: Any) -> Any:
        return config

    def update_model_config(self, model_config: dict) -> dict:
        return model_config

    def get_dependencies(self, weight_name: str) -> set[str]:
        return set()


def _ignore_as_saved(model: Any, config: Any) -> list[str]:
    """config.json's quantization_config `ignore` as the in-memory path's save writes it for `config`: compressed-
    tensors' own QuantizationConfig.from_pretrained, run on `model` (the meta-device model, no weights) once the
    config is applied to it (apply_quantization_config), lists every module of a type some group quantizes that no
    group does, by name (the model's modules in order, then mapped to the checkpoint's names). model_free_ptq wrote
    the recipe's ignore as given (`lm_head`, `re:.*layers.0.*`): a consumer read another list from the same
    recipe's two outputs (issue 57)."""
    import copy

    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    apply_quantization_config(model, copy.deepcopy(config))
    saved = QuantizationConfig.from_pretrained(model)
    return list(saved.ignore) if saved is not None else list(config.ignore)


def _mtp_as_saved(model_dir: Path, folder: Path, config: Any) -> None:
    """The source's multi-token-prediction tensors (architecture.mtp_of: layers after the decoder's, or a prefix the
    family's model ignores) in the streamed output as the in-memory path's save leaves them: model_free_ptq copies
    every stored tensor, so they are taken out of its shards (a shard left empty goes, and the shard index follows),
    then copied back by compressed-tensors' own save_mtp_tensors_to_checkpoint where llm-compressor's save calls it
    (compat.llmcompressor.mtp_copied: a declared `mtp.*` module, which it writes in a shard of its own and adds
    `re:^mtp.*` to the ignore list), laid out as that path lays it out (_single_file_indexed). What neither writes
    (a DeepSeek-V3's `model.layers.61`, an undeclared `mtp.*`) is said in quantize.json's not_converted, as on the
    in-memory path. Before: the streamed output kept every MTP tensor as stored and the in-memory one dropped them."""
    from compressed_tensors.utils import save_mtp_tensors_to_checkpoint
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    mtp = mtp_of(read_config(folder))
    index = folder / SAFE_INDEX
    for f in safetensors_files(folder):
        with safe_open(str(f), framework="pt") as st:
            names = list(st.keys())
        if not (gone := {n for n in names if mtp.holds(n)}):
            continue
        if kept := [n for n in names if n not in gone]:
            tensors = load_file(str(f))
            save_file({n: tensors[n] for n in kept}, str(f), metadata={"format": "pt"})
        else:
            f.unlink()
        if index.is_file():
            data = json.loads(index.read_text())
            data["weight_map"] = {k: v for k, v in data["weight_map"].items() if k not in gone}
            index.write_text(json.dumps(data, indent=2) + "\n")
    if mtp_copied(config):
        save_mtp_tensors_to_checkpoint(str(model_dir), str(folder))
        _single_file_indexed(folder)


def _single_file_indexed(folder: Path) -> None:
    """Where config.json declares MTP layers (`mtp_num_hidden_layers`, `num_mtp_layers`), llm-compressor's save
    copies the source's `mtp.*` tensors, which transformers' model does not load, into a shard of their own
    (compressed_tensors.utils.save_mtp_tensors_to_checkpoint: model_mtp.safetensors) and writes a shard index naming
    it and the shards save_pretrained wrote. Beside a model saved as one model.safetensors, that is a folder
    transformers reads as model.safetensors alone and an index-following loader (vLLM) by its index, which
    files.loaded_weights refuses as two models. model.safetensors becomes the index's first shard
    (model-00001-of-N.safetensors, as save_pretrained names shards) and the index follows it: one layout, the
    index's, read by both."""
    single, index = folder / SAFE_WEIGHTS, folder / SAFE_INDEX
    if not (single.is_file() and index.is_file()):
        return
    data = json.loads(index.read_text())
    shards = sorted(set(data["weight_map"].values()))
    if shards == [SAFE_WEIGHTS] or SAFE_WEIGHTS not in shards:
        return
    name = f"model-00001-of-{len(shards):05d}.safetensors"
    single.rename(folder / name)
    data["weight_map"] = {k: name if v == SAFE_WEIGHTS else v for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data, indent=2) + "\n")


def _rename_experts(folder: Path, names: dict[str, str], renamed: list[tuple[str, str]]) -> None:
    """Every stored expert tensor, the shard index and config.json's quantization targets renamed by `names`
    (plan.checkpoint_name); shards rewritten with save_pretrained's header metadata. A `re:` target also matches
    the module's checkpoint name where transformers renames it on load (`renamed`: plan.renamings): vLLM names
    its modules as the checkpoint does, and found no target for Mixtral's `block_sparse_moe` experts (read in
    vLLM 0.34's source: it would load them as unquantized and fail)."""
    from safetensors.torch import load_file, save_file

    for f in safetensors_files(folder):
        tensors = load_file(f)
        save_file({checkpoint_name(k, names): v for k, v in tensors.items()}, f, metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {checkpoint_name(k, names): v for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    cfg = read_config(folder)
    qc = cfg.get("quantization_config") or {}
    for group in (qc.get("config_groups") or {}).values():
        group["targets"] = [both_names(checkpoint_name(t, names), renamed) for t in group.get("targets") or []]
    if "ignore" in qc:
        qc["ignore"] = [checkpoint_name(t, names) for t in qc["ignore"] or []]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _targets_by_both_names(folder: Path, model: Any) -> None:
    """config.json's config-group targets that name one module (a name, or llm-compressor's `re:^name$` for an
    expert) whose stored name differs from the model's (compat.transformers.saved_names: Nemotron-H's `model.`
    stored `backbone.`, Kimi-Linear's `self_attn.forget_gate.f_a_proj` stored `self_attn.f_a_proj`) rewritten as
    `re:^(?:model's|stored)$`: transformers matches targets against the modules of the model it builds (its
    compressed-tensors quantizer: apply_quantization_config over named_modules), vLLM against the checkpoint's names
    (mapped by the model's own hf_to_vllm_mapper), and `quantize inspect` reads the stored names. Written by the
    model's names alone, the group of a stored tensor was unknown to inspect (an override's second bit width: "cannot
    unpack"), and Kimi-Linear's forget-gate projections matched no target in vLLM. The ignore list is left as
    compressed-tensors writes it (the checkpoint's names)."""
    import re

    cfg = read_config(folder)
    groups = list(((cfg.get("quantization_config") or {}).get("config_groups") or {}).values())
    named = {t: n for g in groups for t in g.get("targets") or [] if (n := _one_module(t)) is not None}
    saved = saved_names(model, [f"{n}.weight" for n in named.values()])
    changed = False
    for g in groups:
        targets = []
        for t in g.get("targets") or []:
            n = named.get(t)
            stored = saved[f"{n}.weight"].removesuffix(".weight") if n is not None else n
            if n is not None and stored != n:
                t, changed = f"re:^(?:{re.escape(n)}|{re.escape(stored)})$", True
            targets.append(t)
        g["targets"] = targets
    if changed:
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _one_module(target: str) -> str | None:
    """The module a target names alone: itself (a name, or a class name, which no renaming touches), or the name a
    `re:^...$` pattern matches literally (llm-compressor's per-expert targets); None for any other pattern."""
    import re

    if not target.startswith("re:"):
        return target
    body = target.removeprefix("re:^").removesuffix("$")
    if not (target.startswith("re:^") and target.endswith("$")):
        return None
    name = re.sub(r"\\(.)", r"\1", body)
    return name if re.escape(name) == body else None


def both_names(target: str, renamed: list[tuple[str, str]]) -> str:
    """A `re:` target that matches its module by the model's name and by the checkpoint's: each renamed part
    (checkpoint, model) becomes an alternation of the two, the checkpoint's as the regex transformers matches stored
    names with (Kimi-Linear's `\\.block_sparse_moe\\.`; escaped again, it matched a stored backslash, so no target
    named Kimi-Linear's stored experts). Other targets are returned as they are."""
    import re

    if not target.startswith("re:"):
        return target
    for stored, model in renamed:
        mine = re.escape(model)
        target = target.replace(mine, f"(?:{mine}|{stored})")
    return target


class _RoutingCounter:
    """Forward pre-hooks on llm-compressor's linearized expert modules that count each expert's routed tokens.
    Registered through llm-compressor's HooksMixin, so the sequential pipeline's propagation pass (hooks disabled)
    is not counted twice. Two ways a family routes:
    - `LinearExperts2D.forward(hidden_states, top_k_index, top_k_weights)`: the router's choices, as indices;
    - `Llama4LinearExperts.forward(hidden_states)`: every expert runs on its own copy of the tokens (E copies
      stacked), each copy scaled by the router's score for that expert, which is sigmoid(-inf) = 0 where the router
      did not choose it (transformers' Llama4TextMoe): an expert's routed tokens are its copy's nonzero rows."""

    def __init__(self, moes: list[tuple[str, Any]]):
        from llmcompressor.modifiers.utils.hooks import HooksMixin

        self.counts: dict[str, list[int]] = {}
        self.tokens: dict[str, int] = {}
        self.top_k: dict[str, int] = {}
        self.hooks = HooksMixin()
        for name, module in moes:
            self.counts[name] = [0] * module.num_experts
            self.tokens[name] = 0
            self.hooks.register_hook(module, self._hook(name, module.num_experts), "forward_pre")

    def _hook(self, name: str, experts: int) -> Any:
        def count(_module: Any, args: tuple[Any, ...]) -> None:
            import torch

            if len(args) > 1:
                top_k_index = args[1]
                self.top_k[name] = int(top_k_index.shape[-1])
                self.tokens[name] += int(top_k_index.shape[0])
                seen = torch.bincount(top_k_index.reshape(-1).long(), minlength=experts).tolist()
            else:  # one scaled copy of the tokens per expert, zero where not routed
                chosen = (args[0].reshape(experts, -1, args[0].shape[-1]) != 0).any(-1)  # experts x tokens
                self.top_k[name] = max(self.top_k.get(name, 0), int(chosen.sum(0).max()))
                self.tokens[name] += int(chosen.shape[1])
                seen = chosen.sum(1).tolist()
            self.counts[name] = [a + b for a, b in zip(self.counts[name], seen, strict=True)]

        return count

    def done(self) -> list[ExpertRouting]:
        self.hooks.remove_hooks()
        return [
            ExpertRouting(
                module=name,
                tokens=self.tokens[name],
                top_k=self.top_k.get(name, 0),
                routed_tokens=self.counts[name],
                all_experts_calibrated=True,
            )
            for name in self.counts
        ]


def serialized(prepared: Any) -> str:
    """What ran, as llm-compressor's own recipe YAML (a verbatim `stages:` recipe as given; compiled modifiers
    through `Recipe.from_modifiers(...).yaml()`), which `llmcompressor.recipe.Recipe.create_instance` loads back."""
    if isinstance(prepared, str):
        return prepared
    from llmcompressor.recipe import Recipe as LlmcRecipe

    return LlmcRecipe.from_modifiers(prepared).yaml()
