"""Tiny models for the graph-level tests: checkpoints, their optimum graphs and Quest exports.

Built once per test session in a temporary folder (no binary model is committed).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import numpy as np

from quest_ort.export.families import FAMILIES, build_default_model
from quest_ort.pipeline import export_sparse
from quest_ort.export.steps import optimum_export
from quest_ort.export.rewrite import SparseSettings

from .scratch import run_folder

# Small enough to export in a second; odd head grouping on the Llama side (G = 3) and the Qwen2
# side (G = 7 on a single KV head, Qwen2.5-0.5B's 14 on 2 scaled down).
TINY = {
    "qwen3": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "llama": dict(vocab_size=256, hidden_size=96, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=16),
    "qwen2": dict(vocab_size=256, hidden_size=112, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=7, num_key_value_heads=1),  # head_dim = 112 / 7 = 16
}
_ROOT = run_folder("quest-export-tests-")


@dataclasses.dataclass(frozen=True)
class TinyModel:
    family: str
    checkpoint: pathlib.Path
    optimum: pathlib.Path  # the optimum ONNX model file
    config: dict


@functools.cache
def tiny_model(family: str) -> TinyModel:
    folder = _ROOT / family
    model = build_default_model(FAMILIES[family], folder / "checkpoint", **TINY[family])
    optimum = optimum_export(folder / "checkpoint", folder / "optimum")
    return TinyModel(family, folder / "checkpoint", optimum, model.config.to_dict())


@functools.cache
def quest_export(family: str, top_k: int, block_size: int = 16, kv_dtype: str = "float32",
                 dense_layers: tuple[int, ...] = (0,), score: str = "bound",
                 importance_fraction: float = 0.0, attention: str = "quest", group_reduce: str = "mean",
                 bounds_dtype: str | None = None, capacity: int = 512,
                 superblock_size: int | None = None) -> pathlib.Path:
    """The tiny model exported once per setting (`attention="gqa"`: the dense GroupQueryAttention
    baseline) for caches of up to `capacity` tokens; `superblock_size` None: the export's default."""
    tiny = tiny_model(family)
    output = _ROOT / (f"{family}-{attention}-k{top_k}-p{block_size}-{kv_dtype}-d{'_'.join(map(str, dense_layers))}"
                      f"-{score}-i{importance_fraction}-{group_reduce}" + (f"-b{bounds_dtype}" if bounds_dtype else "")
                      + (f"-c{capacity}" if capacity != 512 else "")
                      + (f"-u{superblock_size}" if superblock_size is not None else ""))
    if (output / "quest_model.json").is_file():  # the same setting spelled with other arguments
        return output
    settings = SparseSettings(top_k=top_k, block_size=block_size, dense_layers=dense_layers, kv_dtype=kv_dtype,
                              score=score, importance_fraction=importance_fraction, attention=attention,
                              group_reduce=group_reduce, bounds_dtype=bounds_dtype, superblock_size=superblock_size)
    export_sparse(family, output=output, settings=settings, model=str(tiny.checkpoint), capacity=capacity,
                  log=lambda *a, **k: None)
    return output


class OptimumRunner:
    """Logits of the original optimum graph: the prompt's last position, then each forced token."""

    def __init__(self, tiny: TinyModel):
        from quest_ort.runtime.dense import OptimumModel

        self.model = OptimumModel(tiny.optimum, threads=1)

    def run(self, tokens: list[int], steps_after_prompt: list[int]) -> list[np.ndarray]:
        cache = self.model.new_cache(1)
        results = [self.model.step(cache, np.array([tokens]))[0, -1]]
        for token in steps_after_prompt:
            results.append(self.model.step(cache, np.array([[token]]))[0, -1])
        return results


# The text API's tests: a tiny Qwen3 whose vocabulary holds the default tokenizer (bytes, specials
# and a few merges), exported with the exporter's defaults (blocks of 8, per-head selection).
TEXT_VOCAB = 320


@functools.cache
def text_export(top_k: int = 4, capacity: int = 256, dense_layers: tuple[int, ...] | None = None) -> pathlib.Path:
    """The tiny Qwen3 with a tokenizer; `dense_layers` (default: the export's) names the export's folder."""
    folder = _ROOT / f"qwen3-text-k{top_k}-c{capacity}"
    if not (folder / "checkpoint").is_dir():
        build_default_model(FAMILIES["qwen3"], folder / "checkpoint", **{**TINY["qwen3"], "vocab_size": TEXT_VOCAB})
    # Superblocks of 2 blocks: the runtime keeps a reused prefix in whole superblocks (QuestModel.truncate),
    # 16 tokens here, where the default's 128 would leave these tests' prompts nothing to reuse.
    layers = {} if dense_layers is None else {"dense_layers": dense_layers}
    settings = SparseSettings(top_k=top_k, superblock_size=2, **layers)
    output = folder / ("quest" if dense_layers is None else f"quest-d{'_'.join(map(str, dense_layers))}")
    export_sparse("qwen3", output=output, settings=settings, model=str(folder / "checkpoint"), capacity=capacity,
                  log=lambda *a, **k: None)
    return output
