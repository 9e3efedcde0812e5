"""Bad inputs: each gives an error naming the input (or attribute) at fault, never a crash.

Errors surface either when the session is created (types, attributes) or when it runs (shapes,
lengths, indices); both are accepted, the message is what is checked.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from quest_ort.runtime.single_op import run_op

H, N, D, P, C, S = 4, 2, 16, 4, 16, 2
M = C // P


def _valid(op_name):
    rng = np.random.default_rng(0)
    f32 = np.float32
    past = np.array([5, 9], np.int32)
    if op_name == "QuestMetadata":
        inputs = dict(key=rng.standard_normal((2, N, S, D)).astype(f32), block_max=np.zeros((2, N, M, D), f32),
                      block_min=np.zeros((2, N, M, D), f32), past_lens=past)
        return inputs, dict(block_size=P), None
    if op_name == "SparseBlockSelect":
        inputs = dict(query=rng.standard_normal((2, H, S, D)).astype(f32), block_max=np.ones((2, N, M, D), f32),
                      block_min=np.zeros((2, N, M, D), f32), past_lens=past)
        return inputs, dict(num_heads=H, kv_num_heads=N, block_size=P, top_k=2), None
    inputs = dict(query=rng.standard_normal((2, H, S, D)).astype(f32), key=np.ones((2, N, S, D), f32),
                  value=np.ones((2, N, S, D), f32), key_cache=np.zeros((2, N, C, D), f32),
                  value_cache=np.zeros((2, N, C, D), f32), past_lens=past,
                  block_indices=np.array([0, 1, 2, -1] * (2 * N * S), np.int32).reshape(2, N, S, 4))
    return inputs, dict(num_heads=H, kv_num_heads=N, block_size=P), None


def _replace(inputs, **changes):
    return {**inputs, **changes}


BAD = [
    # op, what, change inputs, change attributes, expected words in the message
    ("QuestMetadata", "block_min M differs", lambda x: _replace(x, block_min=np.zeros((2, N, M + 1, D), np.float32)), {}, ["'block_min' dim 2", "M"]),
    ("SparseBlockSelect", "block_max D differs", lambda x: _replace(x, block_max=np.ones((2, N, M, D + 1), np.float32)), {}, ["'block_max' dim 3", "D"]),
    ("SparseBlockAttention", "value S differs", lambda x: _replace(x, value=np.ones((2, N, S + 1, D), np.float32)), {}, ["'value' dim 2", "S"]),
    ("SparseBlockAttention", "key rank 3", lambda x: _replace(x, key=np.ones((2, N, D), np.float32)), {}, ["'key'", "rank 4"]),
    ("SparseBlockAttention", "num_heads vs query", lambda x: x, {"num_heads": 8}, ["'query' dim 1", "'num_heads'"]),
    ("SparseBlockSelect", "H % N != 0", lambda x: _replace(x, query=np.ones((2, 6, S, D), np.float32)), {"num_heads": 6, "kv_num_heads": 4}, ["'num_heads' = 6", "not a multiple"]),
    ("SparseBlockAttention", "H % N != 0", lambda x: x, {"kv_num_heads": 3}, ["'num_heads' = 4", "not a multiple"]),
    ("QuestMetadata", "past_lens < 0", lambda x: _replace(x, past_lens=np.array([5, -1], np.int32)), {}, ["'past_lens'[1]", "negative"]),
    ("SparseBlockSelect", "past_lens < 0", lambda x: _replace(x, past_lens=np.array([-3, 0], np.int32)), {}, ["'past_lens'[0]", "negative"]),
    ("SparseBlockAttention", "total < past", lambda x: _replace(x, total_lens=np.array([4, 10], np.int32)), {}, ["'total_lens'[0] = 4", "less than past_lens"]),
    ("QuestMetadata", "total > past + S", lambda x: _replace(x, total_lens=np.array([5, 12], np.int32)), {}, ["'total_lens'[1] = 12", "exceeds"]),
    ("SparseBlockAttention", "past + S > C", lambda x: _replace(x, past_lens=np.array([5, 15], np.int32)), {}, ["'past_lens'[1] + S = 17", "capacity C"]),
    ("SparseBlockAttention", "total > C", lambda x: _replace(x, past_lens=np.array([5, 15], np.int32), total_lens=np.array([7, 17], np.int32)), {}, ["'total_lens'[1] = 17", "capacity C"]),
    ("QuestMetadata", "past + S > M * P", lambda x: _replace(x, past_lens=np.array([15, 0], np.int32)), {}, ["'past_lens'[0] + S = 17", "M * block_size"]),
    ("SparseBlockSelect", "past + S > M * P", lambda x: _replace(x, past_lens=np.array([0, 16], np.int32)), {}, ["'past_lens'[1] + S = 18", "M * block_size"]),
    ("SparseBlockSelect", "K = 0", lambda x: x, {"top_k": 0}, ["'top_k'", ">= 1"]),
    ("SparseBlockSelect", "K < 0", lambda x: x, {"top_k": -3}, ["'top_k'", ">= 1"]),
    ("QuestMetadata", "P = 0", lambda x: x, {"block_size": 0}, ["'block_size'", ">= 1"]),
    ("SparseBlockAttention", "P < 0", lambda x: x, {"block_size": -4}, ["'block_size'", ">= 1"]),
    ("SparseBlockAttention", "index out of range", lambda x: _replace(x, block_indices=np.where(x["block_indices"] == 2, 4, x["block_indices"]).astype(np.int32)), {}, ["'block_indices'", "outside [-1, 4)"]),
    ("SparseBlockAttention", "index below -1", lambda x: _replace(x, block_indices=np.where(x["block_indices"] == 2, -2, x["block_indices"]).astype(np.int32)), {}, ["'block_indices'", "-2"]),
    ("SparseBlockAttention", "block_indices rows neither N nor H", lambda x: _replace(x, block_indices=np.concatenate([x["block_indices"], x["block_indices"][:, :1]], axis=1)), {}, ["'block_indices' dim 1 is 3", "N = 2", "H = 4"]),
    ("SparseBlockAttention", "index repeated", lambda x: _replace(x, block_indices=np.where(x["block_indices"] == 2, 1, x["block_indices"]).astype(np.int32)), {}, ["'block_indices'", "repeats block 1"]),
    ("SparseBlockAttention", "exact_lens above total", lambda x: _replace(x, exact_lens=np.array([5, 12], np.int32)), {}, ["'exact_lens'[1] = 12", "total_lens[1] = 11"]),
    ("SparseBlockSelect", "exact_lens negative", lambda x: _replace(x, exact_lens=np.array([-1, 0], np.int32)), {}, ["'exact_lens'[0] = -1", "outside [0,"]),
    ("SparseBlockSelect", "exact_lens of other rows", lambda x: _replace(x, exact_lens=np.zeros(3, np.int32)), {}, ["'exact_lens' dim 0", "B"]),
    ("SparseBlockAttention", "exact_lens int64", lambda x: _replace(x, exact_lens=np.zeros(2, np.int64)), {}, ["exact_lens"]),
    ("SparseBlockAttention", "past_lens int64", lambda x: _replace(x, past_lens=x["past_lens"].astype(np.int64)), {}, ["past_lens"]),
    ("SparseBlockSelect", "query float64", lambda x: _replace(x, query=x["query"].astype(np.float64)), {}, ["'query'", "float64"]),
    ("SparseBlockAttention", "key float16, query float32", lambda x: _replace(x, key=x["key"].astype(np.float16)), {}, ["'key'", "float16", "'query'"]),
    ("QuestMetadata", "block_min float16, block_max float32", lambda x: _replace(x, block_min=x["block_min"].astype(np.float16)), {}, ["'block_min'", "float16"]),
    ("SparseBlockSelect", "importance float16", lambda x: _replace(x, block_importance=np.zeros((2, N, M), np.float16)), {}, ["block_importance"]),
    ("SparseBlockSelect", "group_reduce unknown", lambda x: x, {"group_reduce": "median"}, ["'group_reduce'", "'mean', 'max', 'none'"]),
    ("SparseBlockSelect", "importance_fraction > 1", lambda x: x, {"importance_fraction": 1.5}, ["'importance_fraction'", "<= 1"]),
    ("SparseBlockSelect", "sink_blocks < 0", lambda x: x, {"sink_blocks": -1}, ["'sink_blocks'", ">= 0"]),
    ("SparseBlockAttention", "scale < 0", lambda x: x, {"scale": -1.0}, ["'scale'", ">= 0"]),
    ("QuestMetadata", "block_size given as float", lambda x: x, {"block_size": 4.0}, ["'block_size'", "int"]),
    ("SparseBlockSelect", "top_k missing", lambda x: x, {"top_k": None}, ["'top_k'", "required"]),
    ("SparseBlockSelect", "probe without key_cache", lambda x: x, {"score": "probe"}, ["score='probe'", "'key_cache'"]),
    ("SparseBlockSelect", "num_probes = 0", lambda x: x, {"num_probes": 0}, ["'num_probes'", ">= 1"]),
    ("SparseBlockSelect", "top_k past int32", lambda x: x, {"top_k": 2**40}, ["'top_k' = 1099511627776", "int32"]),
    ("QuestMetadata", "block_size past int32", lambda x: x, {"block_size": 2**32 + 4}, ["'block_size'", "int32"]),
    ("QuestMetadata", "zero head dim", lambda x: _replace(x, key=np.ones((2, N, S, 0), np.float32), block_max=np.ones((2, N, M, 0), np.float32), block_min=np.ones((2, N, M, 0), np.float32)), {}, ["'key'", "(D) must be positive"]),
    ("SparseBlockAttention", "zero head dim", lambda x: _replace(x, query=np.ones((2, H, S, 0), np.float32), key=np.ones((2, N, S, 0), np.float32), value=np.ones((2, N, S, 0), np.float32), key_cache=np.ones((2, N, C, 0), np.float32), value_cache=np.ones((2, N, C, 0), np.float32)), {}, ["(D) must be positive"]),
    # The probe's key cache is float only (int8 bounds and their refusals: INT8_BOUNDS_BAD below).
    ("SparseBlockSelect", "probe of an int8 key cache", lambda x: _replace(x, key_cache=np.zeros((2, N, C, D), np.int8), key=np.ones((2, N, S, D), np.float32)), {"score": "probe"}, ["'key_cache'", "int8"]),
    ("QuestMetadata", "key_cache_type unknown", lambda x: x, {"key_cache_type": "int4"}, ["'key_cache_type'", "'float', 'int8'"]),
]


def _valid_chunks(op_name):
    """A valid call with chunk queries (chunk_size 2: S = 2 is one chunk), chunk_indices asked for
    from the select, given to the attention."""
    inputs, attributes, _ = _valid(op_name)
    chunk = dict(chunk_lens=inputs["past_lens"] + S)
    attributes = dict(attributes, chunk_size=2)
    if op_name == "SparseBlockSelect":
        attributes.update(chunk_top_k=8, chunk_window=1, chunk_sink=1)
        return {**inputs, **chunk}, attributes, ("block_indices", "chunk_indices")
    chunk["chunk_indices"] = np.array([0, 1, -1, -1, -1] * (2 * N), np.int32).reshape(2, N, 1, 5)
    return {**inputs, **chunk}, attributes, ("output", "key_cache_out", "value_cache_out")


CHUNK_BAD = [
    # op, what, change inputs, change attributes, expected words in the message
    ("SparseBlockSelect", "chunk_lens above total", lambda x: _replace(x, chunk_lens=np.array([7, 12], np.int32)), {}, ["'chunk_lens'[1] = 12", "total_lens[1] = 11"]),
    ("SparseBlockAttention", "chunk_lens negative", lambda x: _replace(x, chunk_lens=np.array([-1, 0], np.int32)), {}, ["'chunk_lens'[0] = -1", "outside [0,"]),
    ("SparseBlockSelect", "chunk_top_k below the forced blocks", lambda x: x, {"chunk_top_k": 3}, ["'chunk_top_k' = 3", "forced blocks: up to 4"]),
    ("SparseBlockSelect", "chunk_share above 1", lambda x: x, {"chunk_share": 1.5}, ["'chunk_share'", "<= 1"]),
    ("SparseBlockSelect", "chunk_pool 0", lambda x: x, {"chunk_pool": 0}, ["'chunk_pool'", ">= 1"]),
    ("SparseBlockSelect", "chunk_size 0", lambda x: x, {"chunk_size": 0}, ["'chunk_size'", ">= 1"]),
    ("SparseBlockAttention", "chunk_indices without chunk_lens", lambda x: _replace(x, chunk_lens=None), {}, ["'chunk_indices' needs input 'chunk_lens'"]),
    ("SparseBlockAttention", "chunk_lens without chunk_indices", lambda x: _replace(x, chunk_indices=None), {}, ["'chunk_lens' needs input 'chunk_indices'"]),
    ("SparseBlockAttention", "chunk_indices of other chunks", lambda x: x, {"chunk_size": 1}, ["'chunk_indices' dim 2 is 1", "ceil(S / chunk_size) = 2"]),
    ("SparseBlockAttention", "chunk_indices of other heads", lambda x: _replace(x, chunk_indices=np.zeros((2, N + 1, 1, 5), np.int32)), {}, ["'chunk_indices' dim 1", "N"]),
    ("SparseBlockAttention", "chunk_indices past the blocks", lambda x: _replace(x, chunk_indices=np.full((2, N, 1, 5), M, np.int32)), {}, ["'chunk_indices' row 0 holds 4", "outside [-1, 4)"]),
    ("SparseBlockAttention", "chunk_indices repeat a block", lambda x: _replace(x, chunk_indices=np.ones((2, N, 1, 5), np.int32)), {}, ["'chunk_indices' row 0 repeats block 1"]),
]


@pytest.mark.parametrize("op_name, what, change_inputs, change_attributes, words", CHUNK_BAD,
                         ids=[f"{b[0]}-{b[1]}" for b in CHUNK_BAD])
def test_bad_chunk_call_is_reported_by_name(op_name, what, change_inputs, change_attributes, words):
    """Chunk queries (docs/ops.md, chunk queries): their lengths, attributes and lists are checked as
    exact_lens and block_indices are, before anything is written."""
    inputs, attributes, outputs = _valid_chunks(op_name)
    run_op(op_name, inputs, attributes, outputs=outputs)  # the valid baseline runs
    inputs = change_inputs(inputs)
    attributes = {k: v for k, v in {**attributes, **change_attributes}.items() if v is not None}
    with pytest.raises(Exception) as error:
        run_op(op_name, inputs, attributes, outputs=outputs, symbolic_dims=False)
    message = str(error.value)
    for word in words:
        assert word in message, f"{what}: {word!r} not in error message:\n{message}"


def test_chunk_lens_without_the_chunk_output_is_refused():
    """A select given chunk_lens must have somewhere to write the chunks' lists."""
    inputs, attributes, _ = _valid_chunks("SparseBlockSelect")
    with pytest.raises(Exception, match="input 'chunk_lens' is given, but the node has no output 'chunk_indices'"):
        run_op("SparseBlockSelect", inputs, attributes, outputs=("block_indices",))


@pytest.mark.parametrize("op_name, what, change_inputs, change_attributes, words", BAD, ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_bad_input_is_reported_by_name(op_name, what, change_inputs, change_attributes, words):
    inputs, attributes, _ = _valid(op_name)
    run_op(op_name, inputs, attributes)  # the valid baseline runs
    inputs = change_inputs(inputs)
    attributes = {k: v for k, v in {**attributes, **change_attributes}.items() if v is not None}
    with pytest.raises(Exception) as error:
        run_op(op_name, inputs, attributes, symbolic_dims=False)
    message = str(error.value)
    for word in words:
        assert word in message, f"{what}: {word!r} not in error message:\n{message}"


def _valid_int8():
    """A valid SparseBlockAttention call with int8 caches and their scales, scale outputs asked for."""
    inputs, attributes, _ = _valid("SparseBlockAttention")
    int8 = dict(key_cache=np.zeros((2, N, C, D), np.int8), value_cache=np.ones((2, N, C, D), np.int8),
                key_scale=np.full((2, N, C), 0.5, np.float16), value_scale=np.full((2, N, C), 0.25, np.float16))
    return {**inputs, **int8}, attributes


INT8_OUTPUTS = ("output", "key_cache_out", "value_cache_out", "key_scale_out", "value_scale_out")
FLOAT_OUTPUTS = INT8_OUTPUTS[:3]
_FLOAT_CACHES = dict(key_cache=np.zeros((2, N, C, D), np.float32), value_cache=np.zeros((2, N, C, D), np.float32))

INT8_BAD = [
    # what, change the int8 call's inputs, outputs asked for, expected words in the message
    ("int8 caches without key_scale", lambda x: _replace(x, key_scale=None), INT8_OUTPUTS, ["input 'key_scale' is required with int8 caches"]),
    ("int8 caches without value_scale", lambda x: _replace(x, value_scale=None), INT8_OUTPUTS, ["input 'value_scale' is required with int8 caches"]),
    ("int8 caches without either scale", lambda x: _replace(x, key_scale=None, value_scale=None), FLOAT_OUTPUTS, ["'key_scale' is required with int8 caches"]),
    ("key_scale_out left out", lambda x: x, FLOAT_OUTPUTS + ("value_scale_out",), ["output 'key_scale_out' is required with int8 caches"]),
    ("value_scale_out left out", lambda x: x, INT8_OUTPUTS[:4], ["output 'value_scale_out' is required with int8 caches"]),
    ("scales with float32 caches", lambda x: _replace(x, **_FLOAT_CACHES), FLOAT_OUTPUTS, ["input 'key_scale' is given", "float32", "int8 caches only"]),
    ("scale outputs with float32 caches", lambda x: _replace(x, **_FLOAT_CACHES, key_scale=None, value_scale=None), INT8_OUTPUTS, ["output 'key_scale_out' is bound", "not int8"]),
    ("key_scale float32", lambda x: _replace(x, key_scale=x["key_scale"].astype(np.float32)), INT8_OUTPUTS, ["key_scale", "tensor(float16)", "tensor(float)"]),
    ("value_scale int8", lambda x: _replace(x, value_scale=x["value_scale"].astype(np.int8)), INT8_OUTPUTS, ["value_scale", "tensor(float16)", "tensor(int8)"]),
    ("key_scale of another capacity", lambda x: _replace(x, key_scale=np.ones((2, N, C + 1), np.float16)), INT8_OUTPUTS, ["'key_scale' dim 2", "C"]),
    ("value_scale of other heads", lambda x: _replace(x, value_scale=np.ones((2, N + 1, C), np.float16)), INT8_OUTPUTS, ["'value_scale' dim 1", "N"]),
    ("key_scale rank 4", lambda x: _replace(x, key_scale=np.ones((2, N, C, 1), np.float16)), INT8_OUTPUTS, ["'key_scale'", "rank 3"]),
    ("int8 keys, float16 values", lambda x: _replace(x, value_cache=np.zeros((2, N, C, D), np.float16)), INT8_OUTPUTS, ["'value_cache'", "float16", "int8"]),
]


@pytest.mark.parametrize("what, change_inputs, outputs, words", INT8_BAD, ids=[b[0] for b in INT8_BAD])
def test_bad_int8_call_is_reported_by_name(what, change_inputs, outputs, words):
    inputs, attributes = _valid_int8()
    run_op("SparseBlockAttention", inputs, attributes, outputs=INT8_OUTPUTS)  # the valid baseline runs
    with pytest.raises(Exception) as error:
        run_op("SparseBlockAttention", change_inputs(inputs), attributes, outputs=outputs, symbolic_dims=False)
    message = str(error.value)
    for word in words:
        assert word in message, f"{what}: {word!r} not in error message:\n{message}"


def _valid_int8_bounds(op_name):
    """A valid QuestMetadata or SparseBlockSelect call with int8 bounds and their exponents, and the
    outputs it has (QuestMetadata's exponents too)."""
    inputs, attributes, _ = _valid(op_name)
    codes = dict(block_max=np.full((2, N, M, D), 3, np.int8), block_min=np.full((2, N, M, D), -2, np.int8),
                 block_exponent=np.full((2, N, M), -4, np.int8))
    outputs = ("block_max_out", "block_min_out", "block_exponent_out") if op_name == "QuestMetadata" else None
    return {**inputs, **codes}, attributes, outputs


_FLOAT_BOUNDS = dict(block_max=np.ones((2, N, M, D), np.float32), block_min=np.zeros((2, N, M, D), np.float32))
_BOUNDS_OUTPUTS = ("block_max_out", "block_min_out")
_EXPONENT = "block_exponent"
# (the exponent input's name as a word: not the start of block_exponent_out)
_EXPONENT_INPUT = r"\bblock_exponent\b(?!_out)"

_HALF_BOUNDS = {name: value.astype(np.float16) for name, value in _FLOAT_BOUNDS.items()}
_NO_EXPONENT = dict(block_exponent=None)


def _exponent(dtype=np.int8, shape=(2, N, M)):
    """A change that replaces the exponents with zeros of another type or shape."""
    return lambda x: _replace(x, block_exponent=np.zeros(shape, dtype))


INT8_BOUNDS_BAD = [
    # op, what, change the int8-bound call's inputs, outputs asked for (None: the op's default),
    # change attributes, the tensor or attribute the message must name (a regular expression)
    ("QuestMetadata", "int8 bounds without block_exponent", lambda x: _replace(x, **_NO_EXPONENT), _BOUNDS_OUTPUTS,
     {}, _EXPONENT_INPUT),
    ("SparseBlockSelect", "int8 bounds without block_exponent", lambda x: _replace(x, **_NO_EXPONENT), None, {},
     _EXPONENT_INPUT),
    ("QuestMetadata", "block_exponent with float32 bounds", lambda x: _replace(x, **_FLOAT_BOUNDS), None, {},
     _EXPONENT),
    ("SparseBlockSelect", "block_exponent with float32 bounds", lambda x: _replace(x, **_FLOAT_BOUNDS), None, {},
     _EXPONENT_INPUT),
    ("SparseBlockSelect", "block_exponent with float16 bounds", lambda x: _replace(x, **_HALF_BOUNDS), None, {},
     _EXPONENT_INPUT),
    ("QuestMetadata", "block_exponent_out with float32 bounds",
     lambda x: _replace(x, **_FLOAT_BOUNDS, **_NO_EXPONENT), _BOUNDS_OUTPUTS + ("block_exponent_out",), {}, _EXPONENT),
    ("QuestMetadata", "int8 bounds without block_exponent_out", lambda x: x, _BOUNDS_OUTPUTS, {},
     r"\bblock_exponent_out\b"),
    ("QuestMetadata", "block_exponent float32", _exponent(np.float32), None, {}, _EXPONENT_INPUT),
    ("SparseBlockSelect", "block_exponent int32", _exponent(np.int32), None, {}, _EXPONENT_INPUT),
    ("QuestMetadata", "block_exponent of another M", _exponent(shape=(2, N, M + 1)), None, {}, _EXPONENT_INPUT),
    ("SparseBlockSelect", "block_exponent of other heads", _exponent(shape=(2, N + 1, M)), None, {}, _EXPONENT_INPUT),
    ("SparseBlockSelect", "block_exponent rank 4", _exponent(shape=(2, N, M, 1)), None, {}, _EXPONENT_INPUT),
    ("QuestMetadata", "block_exponent rank 2", _exponent(shape=(2, N * M)), None, {}, _EXPONENT_INPUT),
    ("QuestMetadata", "int8 block_max, float32 block_min",
     lambda x: _replace(x, block_min=x["block_min"].astype(np.float32)), None, {}, r"\bblock_min\b"),
    # The probe's key cache shares TC with the bounds: with int8 bounds there is no probe (an int8
    # key cache is refused as well, so either refusal may come first: the message names the probe's
    # attribute or input).
    ("SparseBlockSelect", "probe with int8 bounds",
     lambda x: _replace(x, key_cache=np.zeros((2, N, C, D), np.int8), key=np.ones((2, N, S, D), np.float32)), None,
     {"score": "probe"}, r"probe|\bscore\b|\bkey_cache\b"),
]


@pytest.mark.parametrize("op_name, what, change_inputs, outputs, change_attributes, culprit", INT8_BOUNDS_BAD,
                         ids=[f"{b[0]}-{b[1]}" for b in INT8_BOUNDS_BAD])
def test_bad_int8_bounds_call_is_reported_by_name(op_name, what, change_inputs, outputs, change_attributes, culprit):
    """Only the tensor (or attribute) at fault and the op are checked, not the wording around them."""
    inputs, attributes, int8_outputs = _valid_int8_bounds(op_name)
    run_op(op_name, inputs, attributes, outputs=int8_outputs)  # the valid baseline runs
    with pytest.raises(Exception) as error:
        run_op(op_name, change_inputs(inputs), {**attributes, **change_attributes}, outputs=outputs,
               symbolic_dims=False)
    message = str(error.value)
    assert op_name in message, f"{what}: the op is not named:\n{message}"
    assert re.search(culprit, message), f"{what}: nothing matching {culprit!r} in the error message:\n{message}"


def _valid_superblocks(int8: bool):
    """A valid hierarchical SparseBlockSelect call (superblocks of U = 2 blocks: MS = 2), float32 or
    int8 bounds."""
    inputs, attributes, _ = _valid_int8_bounds("SparseBlockSelect") if int8 else _valid("SparseBlockSelect")
    MS = M // 2
    dtype = np.int8 if int8 else np.float32
    supers = dict(super_max=np.full((2, N, MS, D), 3, dtype), super_min=np.full((2, N, MS, D), -2, dtype))
    if int8:
        supers["super_exponent"] = np.full((2, N, MS), -4, np.int8)
    return {**inputs, **supers}, dict(attributes, superblock_size=2, candidate_factor=1)


SUPERBLOCK_BAD = [
    # what, int8 bounds, change inputs, change attributes, the culprit (a regex on the message)
    ("super_max without super_min", False, lambda x: _replace(x, super_min=None), {}, r"'super_max' and 'super_min'"),
    ("super_min without super_max", True, lambda x: _replace(x, super_max=None), {}, r"'super_max' and 'super_min'"),
    ("super_exponent without superblocks", True, lambda x: _replace(x, super_max=None, super_min=None), {},
     r"'super_exponent'"),
    ("int8 superblocks without super_exponent", True, lambda x: _replace(x, super_exponent=None), {},
     r"'super_exponent' is required"),
    ("super_exponent with float bounds", False, lambda x: _replace(x, super_exponent=np.zeros((2, N, M // 2), np.int8)),
     {}, r"'super_exponent' is given"),
    ("superblocks of another size", False, lambda x: x, {"superblock_size": 1}, r"'super_max' dim 2"),
    ("super_min of other heads", False, lambda x: _replace(x, super_min=np.zeros((2, N + 1, M // 2, D), np.float32)),
     {}, r"'super_min' dim 1"),
    ("float16 superblocks next to float32 blocks", False,
     lambda x: _replace(x, super_max=x["super_max"].astype(np.float16), super_min=x["super_min"].astype(np.float16)),
     {}, r"super_max|super_min"),
    ("superblocks with the probe score", False,
     lambda x: _replace(x, key_cache=np.zeros((2, N, C, D), np.float32), key=np.ones((2, N, S, D), np.float32)),
     {"score": "probe"}, r"probe.*superblocks"),
    ("superblock_size 0", False, lambda x: x, {"superblock_size": 0}, r"'superblock_size'"),
    ("candidate_factor 0", False, lambda x: x, {"candidate_factor": 0}, r"'candidate_factor'"),
]


@pytest.mark.parametrize("what, int8, change_inputs, change_attributes, culprit", SUPERBLOCK_BAD,
                         ids=[b[0] for b in SUPERBLOCK_BAD])
def test_bad_superblock_call_is_reported_by_name(what, int8, change_inputs, change_attributes, culprit):
    """The hierarchical selection's inputs and attributes (docs/ops.md, hierarchical selection)."""
    inputs, attributes = _valid_superblocks(int8)
    run_op("SparseBlockSelect", inputs, attributes)  # the valid baseline runs
    with pytest.raises(Exception) as error:
        run_op("SparseBlockSelect", change_inputs(inputs), {**attributes, **change_attributes}, symbolic_dims=False)
    message = str(error.value)
    assert "SparseBlockSelect" in message, f"{what}: the op is not named:\n{message}"
    assert re.search(culprit, message), f"{what}: nothing matching {culprit!r} in the error message:\n{message}"


HUGE = 2**31 - 1  # heads: allowed by the attributes, and empty tensors cost nothing to pass


@pytest.mark.parametrize("op_name", ["QuestMetadata", "SparseBlockSelect", "SparseBlockAttention"])
def test_a_call_with_no_new_token_returns_empty_results(op_name):
    # S = 0 next to 2^31 - 1 heads: nothing to compute, so nothing may loop over the heads either
    # (the fuzzer found such a call spending half a minute in an empty loop).
    f32, empty = np.float32, np.zeros((1, HUGE, 0, 1), np.float32)
    past = np.zeros(1, np.int32)
    if op_name == "QuestMetadata":
        inputs, attributes = dict(key=empty, block_max=empty, block_min=empty, past_lens=past), dict(block_size=P)
    elif op_name == "SparseBlockSelect":
        inputs = dict(query=empty, block_max=empty, block_min=empty, past_lens=past)
        attributes = dict(num_heads=HUGE, kv_num_heads=HUGE, block_size=P, top_k=1)
    else:
        inputs = dict(query=empty, key=empty, value=empty, key_cache=empty, value_cache=empty, past_lens=past)
        attributes = dict(num_heads=HUGE, kv_num_heads=HUGE, block_size=P)
    outputs = run_op(op_name, inputs, attributes, symbolic_dims=False)
    for name, value in outputs.items():
        assert value.size == 0 and value.dtype in (f32, np.int32), (name, value.shape, value.dtype)
