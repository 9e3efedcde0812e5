"""Build a tiny random-weight Hugging Face model and run onnxruntime-genai's model builder on it.

Run with the Python of the builder's own environment (build/genai-venv, `make test-genai` makes it:
the builder needs transformers 5.x, the project's .venv has 4.57), never imported by the tests:

    build/genai-venv/bin/python tests/export/genai_builder_model.py OUT --family llama [--accuracy-level 1] [--int8-kv]
    build/genai-venv/bin/python tests/export/genai_builder_model.py OUT --checkpoint FOLDER [--accuracy-level 1]

writes OUT/hf (config, random weights, a word-level tokenizer built here: no hub download) and
OUT/onnx (the builder's model.onnx, its data and genai_config.json); with --checkpoint, the builder
converts that local Hugging Face folder instead (real weights: SmolLM2 from `quest-ort-weights`). Weights are drawn with a wide
initializer so that greedy tokens are decided by clear margins, not by float rounding.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

# Small but in the builder's shape: heads share KV heads (GQA), hidden sizes are multiples of the
# int4 quantizer's block of 32, head size 32 (RoPE over the whole head). The vocabulary differs from
# every projection's width: the builder takes any Linear with vocab_size outputs for the LM head.
FAMILIES = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"]),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32),
}
GEOMETRY = dict(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2,
                torch_dtype="float32")


def write_tokenizer(folder: pathlib.Path, vocab_size: int) -> None:
    """A word-level tokenizer over the words w3 .. w{vocab-1} plus <pad>, <s>, </s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<pad>").save_pretrained(folder)


def write_checkpoint(folder: pathlib.Path, family: str, seed: int) -> None:
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**{**GEOMETRY, **FAMILIES[family]})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norm weights around 1 but not 1, so no optimizer treats them as identity
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.8, 1.2)
    model.save_pretrained(folder)
    write_tokenizer(folder, config.vocab_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    parser.add_argument("--precision", default="int4", choices=["int4", "fp32"])
    parser.add_argument("--accuracy-level", type=int, choices=range(5), default=None,
                        help="MatMulNBits' accuracy_level (the builder's default on CPU: 4, int8 activations)")
    parser.add_argument("--int8-kv", action="store_true",
                        help="an int8 per-tensor KV cache (GroupQueryAttention's k_scale / v_scale)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=pathlib.Path, help="convert this Hugging Face folder instead")
    args = parser.parse_args()
    hf, onnx_dir = args.out / "hf", args.out / "onnx"
    if args.checkpoint is not None:
        hf = args.checkpoint
    else:
        write_checkpoint(hf, args.family, args.seed)
    # The builder as a user runs it; its cache folder stays inside OUT (nothing is downloaded).
    options = [] if args.accuracy_level is None else [f"accuracy_level={args.accuracy_level}"]
    if args.int8_kv:  # the builder takes calibrated scales from a file; any positive scale builds the graph
        scales = args.out / "kv_scales.json"
        layers = json.loads((hf / "config.json").read_text())["num_hidden_layers"]
        scales.write_text(json.dumps({"scales": {"k_scales": [0.05] * layers, "v_scales": [0.05] * layers}}))
        options += ["kv_cache_quant_scheme=int8_per_tensor", f"kv_cache_scale_file={scales}"]
    extra = ["--extra_options", *options] if options else []
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(onnx_dir),
                    "-p", args.precision, "-e", "cpu", "-c", str(args.out / "cache"), *extra], check=True)
    config = json.loads((onnx_dir / "genai_config.json").read_text())
    print(json.dumps(config["model"]["decoder"], indent=1)[:2000])


if __name__ == "__main__":
    main()
