"""Model families `export-sparse` knows: their embedded defaults and how their checkpoints load.

A family fixes which attention rule applies (Qwen3 with q/k norm, Llama and Qwen2 without) and,
with no `--model`, builds a small model from a config with deterministic random weights, so the
command works on a machine with no network and no checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib

from .default_tokenizer import END_OF_TURN_ID, save_default_tokenizer


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    model_type: str  # transformers' config.model_type
    default_config: dict
    description: str


FAMILIES = {
    "qwen3": Family(
        name="qwen3",
        model_type="qwen3",
        default_config=dict(
            vocab_size=8192, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
            num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=32768,
            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
        description="Qwen3 (q/k RMSNorm, rotate-half RoPE, grouped-query attention)",
    ),
    "llama": Family(
        name="llama",
        model_type="llama",
        default_config=dict(
            vocab_size=8192, hidden_size=576, intermediate_size=1536, num_hidden_layers=4,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
            rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        ),
        description="Llama family (SmolLM2 and friends: rotate-half RoPE, grouped-query attention)",
    ),
    # Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections. The default keeps Qwen2.5-0.5B's
    # head size, RoPE base and odd grouping (7 query heads on one KV head; the real model has 14 on 2).
    # transformers' Qwen2Config takes no head_dim: it is hidden_size / num_attention_heads.
    "qwen2": Family(
        name="qwen2",
        model_type="qwen2",
        default_config=dict(
            vocab_size=8192, hidden_size=448, intermediate_size=1216, num_hidden_layers=4,
            num_attention_heads=7, num_key_value_heads=1, max_position_embeddings=32768,
            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        ),
        description="Qwen2 / Qwen2.5 (Llama with q/k/v projection biases, grouped-query attention)",
    ),
}

DEFAULT_SEED = 0


def build_default_model(family: Family, directory: pathlib.Path, seed: int = DEFAULT_SEED, **overrides):
    """Save a small random model of `family` (norm weights and biases randomised too) into `directory`,
    with the default tokenizer (export/default_tokenizer.py) when the vocabulary can hold one.

    All-ones norm weights would let an optimizer merge q_norm and k_norm's identical initializers,
    so every norm weight is drawn around 1. Biases (Qwen2's q/k/v) are drawn on the scale of their
    projection's output rather than left at zero, so a graph that drops one or adds it after RoPE
    instead of before gives different logits.
    """
    import torch
    import transformers

    config_class = transformers.AutoConfig.for_model(family.model_type).__class__
    config = config_class(**{**family.default_config, **overrides})
    generator = torch.Generator().manual_seed(seed)
    with torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            elif name.endswith(".bias"):
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
    model.generation_config.pad_token_id = 0
    if save_default_tokenizer(directory, config.vocab_size):  # its end of turn ends a reply
        model.generation_config.eos_token_id = END_OF_TURN_ID
    model.save_pretrained(directory)
    return model


def load_checkpoint(source: str, work: pathlib.Path) -> pathlib.Path:
    """A local Hugging Face directory for `source`: a directory as is, a GGUF file converted with
    transformers (needs the `gguf` package), or a hub id (needs a network)."""
    path = pathlib.Path(source)
    if path.is_dir():
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"--model {source}: no such GGUF file")
        return convert_gguf(path, work / "checkpoint")
    if path.exists():
        raise ValueError(f"--model {source}: expected a Hugging Face model directory or a .gguf file")
    from huggingface_hub import snapshot_download

    try:
        return pathlib.Path(snapshot_download(source))
    except Exception as error:  # offline machines land here
        raise RuntimeError(f"--model {source}: not a local path, and the hub download failed: {error}") from error


def convert_gguf(gguf: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """Save the GGUF checkpoint `gguf` dequantised to float32 as a Hugging Face folder `out` (model
    and tokenizer), with transformers (needs the `gguf` package; minutes for a 0.5B model)."""
    import torch
    import transformers

    # transformers draws its own bar over the GGUF's tensors (no setting turns it off): kept off the
    # terminal, where the command's own messages say what runs; a failure still raises.
    with contextlib.redirect_stderr(io.StringIO()):
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def read_config(directory: pathlib.Path) -> dict:
    import json

    return json.loads((directory / "config.json").read_text())
