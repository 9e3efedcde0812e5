"""Case folders of the kernel-level drivers (tools/case_io.h): the conformance cases written as
case.txt plus raw arrays, the reference outputs, and reading a variant's outputs back."""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from .cases import CALLS, make_data
from quest_ort.ops.reference import REFERENCES

OUTPUTS = {
    "QuestMetadata": ("block_max_out", "block_min_out"),
    "SparseBlockSelect": ("block_indices",),
    "SparseBlockAttention": ("output", "key_cache_out", "value_cache_out", "block_importance"),
}
SCALE_OUTPUTS = ("key_scale_out", "value_scale_out")  # SparseBlockAttention's, with int8 caches only
EXPONENT_OUTPUTS = ("block_exponent_out",)  # QuestMetadata's, with int8 bounds only
# The outputs a call has only with an input of its own: (input, outputs) per op.
EXTRA_OUTPUTS = {"SparseBlockAttention": ("key_scale", SCALE_OUTPUTS),
                 "QuestMetadata": ("block_exponent", EXPONENT_OUTPUTS),
                 "SparseBlockSelect": ("chunk_lens", ("chunk_indices",))}


def outputs_of(op_name: str, inputs: dict) -> tuple[str, ...]:
    """The outputs of a call, in the reference's order: OUTPUTS, and the scales with int8 caches, the
    exponents with int8 bounds, the chunks' selections with chunk queries."""
    given, extra = EXTRA_OUTPUTS.get(op_name, (None, ()))
    return OUTPUTS[op_name] + (extra if given is not None and inputs.get(given) is not None else ())


def write_case(directory: pathlib.Path, op_name, inputs, attributes, case, total_lens, **extra):
    """case.txt and <input>.bin; capacity and block count come from the arrays when present. TC is
    the dtype of the call's own storage: the caches of SparseBlockAttention (int8 too), else the
    block bounds."""
    H, N = case.heads
    storage = inputs["key_cache"] if op_name == "SparseBlockAttention" else inputs["block_max"]
    capacity = inputs["key_cache"].shape[2] if inputs.get("key_cache") is not None else case.capacity()
    indices = inputs.get("block_indices")
    rows = indices.shape[1] if indices is not None else (H if case.reduce == "none" else N)  # R of block_indices
    fields = dict(op=op_name, T=case.dtypes[0], TC=storage.dtype.name, B=case.batch, H=H, N=N, R=rows,
                  S=case.new_tokens, D=case.head_dim, M=case.num_blocks(), C=capacity, P=case.block_size,
                  K=0 if inputs.get("block_indices") is None and op_name == "SparseBlockAttention" else case.k(),
                  sink_blocks=case.sink, recent_blocks=case.recent, group_reduce=case.reduce,
                  importance_fraction=attributes.get("importance_fraction", 0.0),
                  with_importance=int(inputs.get("block_importance") is not None),
                  with_exact=int(inputs.get("exact_lens") is not None), scale=0.0, softcap=0.0,
                  score=case.score, num_probes=case.num_probes,
                  key_cache_type=attributes.get("key_cache_type", "float"),
                  with_chunks=int(inputs.get("chunk_lens") is not None), Q=case.chunk_size,
                  KC=case.chunk_top_k(), chunk_share=case.chunk_share, chunk_window=case.chunk_window, chunk_sink=case.sink,
                  chunk_pool=case.chunk_pool, chunk_floor=case.chunk_floor,
                  with_superblocks=int(inputs.get("super_max") is not None), U=case.superblock_size or 8,
                  MS=case.num_superblocks() if case.superblock_size else 0, candidate_factor=case.candidate_factor,
                  **extra)
    if op_name == "SparseBlockAttention":
        fields["scale"] = float(np.float32(1.0) / np.sqrt(np.float32(case.head_dim)))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "case.txt").write_text("".join(f"{k} {v}\n" for k, v in fields.items()))
    for name, array in {**inputs, "total_lens": total_lens}.items():
        if array is not None:
            np.ascontiguousarray(array).tofile(directory / f"{name}.bin")


def read_output(directory, variant, name, like):
    return np.fromfile(directory / f"{variant}.{name}.bin", dtype=like.dtype).reshape(like.shape)


@functools.cache
def case_data(case):
    return make_data(case)


def expected(call, case, inputs_of=None):
    """(inputs, attributes, reference outputs) of `call` (a key of cases.CALLS, e.g. an op name) on
    the case; `inputs_of` may adjust the inputs (e.g. pad the caches) before the reference runs."""
    op_name, arguments = CALLS[call]
    inputs, attributes = arguments(case_data(case))
    if inputs_of is not None:
        inputs = inputs_of(inputs)
    outputs = REFERENCES[op_name](**inputs, **attributes)
    return inputs, attributes, outputs if isinstance(outputs, tuple) else (outputs,)


def total_lens(inputs, case):
    total = inputs["total_lens"] if inputs.get("total_lens") is not None else inputs["past_lens"] + case.new_tokens
    return total.astype(np.int32)
