"""int8 block bounds through ONNX Runtime: every kernel variant (forced by QUEST_ORT_ISA in its own
process) against the NumPy reference, and QuestMetadata's codes independent of how calls chunk the
keys (docs/ops.md, int8 block bounds)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from quest_ort.ops import native_supported_isas
from quest_ort.ops.reference import quest_metadata, sparse_block_select
from quest_ort.runtime.single_op import run_op
from support.tolerances import assert_equal

B, N, H, P = 3, 2, 6, 4
PAST = np.array([9, 0, 5], np.int32)
S = 11
TOTAL = np.array([20, 11, 10], np.int32)  # the last row padded
EDGE_EXPONENTS = (-128, -127, -126, 10, 126, 127)


def _keys(rng, D, dtype, tokens=S):
    """Keys of magnitudes 1e-3 to 1e3, with NaN, infinities and values past float16's range in some rows."""
    key = (rng.standard_normal((B, N, tokens, D)) * 10.0 ** rng.uniform(-3, 3, (B, N, tokens, 1))).astype(np.float32)
    key[0, 1, 3, 0] = np.nan
    key[1, 0, 6, D - 1] = 7e4
    key[2, 1, 2, D // 2] = -np.inf
    with np.errstate(over="ignore"):
        return key.astype(dtype)


def calls(D: int, key_dtype: str):
    """(op, inputs, attributes) of int8-bound calls: held bounds with edge exponents, both key
    cache types, and selections over the bounds the reference builds, for each group_reduce."""
    rng = np.random.default_rng(D)
    M = -(-int(TOTAL.max()) // P) + 1
    a, b = rng.integers(-128, 128, (B, N, M, D)), rng.integers(-128, 128, (B, N, M, D))
    exponent = rng.integers(-10, 4, (B, N, M)).astype(np.int8)
    exponent.flat[: len(EDGE_EXPONENTS)] = EDGE_EXPONENTS
    held = dict(block_max=np.maximum(a, b).astype(np.int8), block_min=np.minimum(a, b).astype(np.int8),
                past_lens=PAST, total_lens=TOTAL, block_exponent=exponent)
    key = _keys(rng, D, key_dtype)
    out = [("QuestMetadata", dict(key=key, **held), dict(block_size=P, key_cache_type=kind))
           for kind in ("float", "int8")]
    with np.errstate(all="ignore"):
        built = quest_metadata(key, **held, block_size=P)
    query = rng.standard_normal((B, H, S, D)).astype(key_dtype)
    for reduce in ("mean", "max", "none"):
        inputs = dict(query=query, block_max=built[0], block_min=built[1], past_lens=PAST, total_lens=TOTAL,
                      block_exponent=built[2])
        out.append(("SparseBlockSelect", inputs, dict(num_heads=H, kv_num_heads=N, block_size=P, top_k=2,
                                                      group_reduce=reduce)))
    return out


CONFIGS = [(D, dtype) for D in (1, 17, 128) for dtype in ("float32", "float16")]


def all_outputs() -> dict[str, np.ndarray]:
    """Every call's outputs through the op library, by '<config>-<call>-<output>'."""
    result = {}
    for D, dtype in CONFIGS:
        for number, (op_name, inputs, attributes) in enumerate(calls(D, dtype)):
            for name, value in run_op(op_name, inputs, attributes, threads=2).items():
                result[f"D{D}-{dtype}-{number}-{name}"] = value
    return result


def reference_outputs() -> dict[str, np.ndarray]:
    reference = {"QuestMetadata": quest_metadata, "SparseBlockSelect": sparse_block_select}
    names = {"QuestMetadata": ("block_max_out", "block_min_out", "block_exponent_out"),
             "SparseBlockSelect": ("block_indices",)}
    result = {}
    for D, dtype in CONFIGS:
        for number, (op_name, inputs, attributes) in enumerate(calls(D, dtype)):
            with np.errstate(all="ignore"):
                values = reference[op_name](**inputs, **attributes)
            for name, value in zip(names[op_name], values if isinstance(values, tuple) else (values,), strict=True):
                result[f"D{D}-{dtype}-{number}-{name}"] = value
    return result


@pytest.mark.parametrize("isa", native_supported_isas())
def test_every_variant_through_onnxruntime_meets_the_reference(isa, tmp_path):
    path = tmp_path / "outputs.npz"
    here = pathlib.Path(__file__).resolve().parent  # the child imports this module, which imports support.*
    script = (f"import sys; sys.path[:0] = {[str(here), str(here.parent)]!r}; import numpy as np; "
              f"import test_int8_bounds as t; from quest_ort.ops import native_kernel_isa; "
              f"assert native_kernel_isa() == {isa!r}, native_kernel_isa(); "
              f"np.savez({str(path)!r}, **t.all_outputs())")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "QUEST_ORT_ISA": isa}, cwd=tmp_path)
    got = dict(np.load(path))
    want = reference_outputs()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert_equal(got[name], value, f"{isa} {name}")


# How a row's tokens may arrive: one call, token by token, in threes, in uneven pieces.
CHUNKINGS = {"one call": [40], "token by token": [1] * 40, "threes": [3] * 14, "uneven": [5, 1, 2, 9, 4, 7, 3, 6, 3]}


@pytest.mark.parametrize("key_cache_type", ["float", "int8"])
@pytest.mark.parametrize("key_dtype", ["float32", "float16"])
@pytest.mark.parametrize("D", [1, 17, 128])
def test_chunked_metadata_calls_give_the_same_bits(D, key_dtype, key_cache_type):
    """A block's codes and exponent depend only on the keys it holds: every chunking of the same
    keys into QuestMetadata calls (rows at different lengths) ends in the same bits, the reference's
    of one call."""
    rng = np.random.default_rng(D + 1)
    tokens = 40
    key = _keys(rng, D, key_dtype, tokens)
    M = tokens // P + 1
    start = dict(block_max=np.zeros((B, N, M, D), np.int8), block_min=np.zeros((B, N, M, D), np.int8),
                 block_exponent=np.zeros((B, N, M), np.int8))
    attributes = dict(block_size=P, key_cache_type=key_cache_type)
    lengths = np.array([tokens, tokens - 7, tokens - 13], np.int32)  # rows of different lengths
    with np.errstate(all="ignore"):
        want = quest_metadata(key, **start, past_lens=np.zeros(B, np.int32), total_lens=lengths, **attributes)
    for name, pieces in CHUNKINGS.items():
        state, past = dict(start), 0
        for size in pieces:
            past_lens = np.minimum(past, lengths).astype(np.int32)
            total = np.minimum(past + size, lengths).astype(np.int32)
            got = run_op("QuestMetadata", dict(key=key[:, :, past : past + size], **state, past_lens=past_lens,
                                               total_lens=total), attributes)
            state = dict(block_max=got["block_max_out"], block_min=got["block_min_out"],
                         block_exponent=got["block_exponent_out"])
            past += size
        for output, value in zip(("block_max", "block_min", "block_exponent"), want, strict=True):
            assert_equal(state[output], value, f"{output} with the keys {name}")


# Scoring rows at the edges of their 7-bit quantization (docs/ops.md, int8 block bounds), by kind:
# the reference's NaN, infinite, zero and saturating rows, and ties of the rounding.
QUERY_KINDS = ("normal", "nan", "+inf", "-inf", "zeros", "signed zeros", "huge channel", "-0 row", "subnormal",
               "ties", "tiny", "one channel")


def _query_row(kind: str, rng, D: int) -> np.ndarray:
    row = rng.standard_normal(D).astype(np.float32)
    at = int(rng.integers(D))
    if kind == "nan":
        row[at] = np.nan
    elif kind in ("+inf", "-inf"):
        row[at] = np.inf if kind == "+inf" else -np.inf
    elif kind == "zeros":
        row[:] = 0.0
    elif kind == "signed zeros":  # +0 and -0 channels among numbers: neither bound is picked
        row[::3], row[1::3] = 0.0, -0.0
    elif kind == "huge channel":  # every other channel rounds to 0
        row *= 1e-3
        row[at] = -3e4
    elif kind == "-0 row":
        row[:] = -0.0
    elif kind == "subnormal":  # 127 / a is infinite: every nonzero channel saturates at 127
        row = (row * 1e-40).astype(np.float32)
        row[at] = 0.0
    elif kind == "ties":  # a = 127: |q| * 1 lands on halves, which round to even
        row = (rng.integers(-40, 40, D) + 0.5).astype(np.float32)
        row[at] = 127.0
    elif kind == "tiny":
        row *= np.float32(1e-37)
    elif kind == "one channel":
        row[:] = 0.0
        row[at] = -2.5
    return row


def query_calls(D: int, dtype: str, heads=(14, 2)):
    """SparseBlockSelect calls over int8 codes (unsorted pairs and -128 included, edge exponents)
    with query rows of every QUERY_KINDS kind, for each group_reduce; enough blocks that the
    integer tiles' block tails and row tails are all reached."""
    rng = np.random.default_rng(1000 + D)
    H_, N_ = heads
    Bq, Sq, Pq, Mq = 2, 6, 4, 37
    past = np.array([100, 123], np.int32)
    a, b = rng.integers(-128, 128, (Bq, N_, Mq, D)), rng.integers(-128, 128, (Bq, N_, Mq, D))
    codes_max, codes_min = np.maximum(a, b).astype(np.int8), np.minimum(a, b).astype(np.int8)
    codes_max[0, 0, :5], codes_min[0, 0, :5] = b[0, 0, :5], a[0, 0, :5]  # max < min in some channels
    codes_min[1, 1, 3:9] = -128
    exponent = rng.integers(-10, 4, (Bq, N_, Mq)).astype(np.int8)
    exponent.flat[7 : 7 + len(EDGE_EXPONENTS)] = EDGE_EXPONENTS
    query = np.stack([_query_row(QUERY_KINDS[j % len(QUERY_KINDS)], rng, D) for j in range(Bq * H_ * Sq)])
    with np.errstate(over="ignore"):
        query = query.reshape(Bq, H_, Sq, D).astype(dtype)
    out = []
    for reduce in ("mean", "max", "none"):
        inputs = dict(query=query, block_max=codes_max, block_min=codes_min, past_lens=past,
                      total_lens=past + Sq, block_exponent=exponent)
        out.append(("SparseBlockSelect", inputs, dict(num_heads=H_, kv_num_heads=N_, block_size=Pq, top_k=9,
                                                      group_reduce=reduce)))
    return out


QUERY_CONFIGS = [(D, "float32") for D in (1, 15, 64, 65, 127, 128, 129, 1024)] + [(80, "float16"), (128, "float16")]


def query_outputs() -> dict[str, np.ndarray]:
    result = {}
    for D, dtype in QUERY_CONFIGS:
        for number, (op_name, inputs, attributes) in enumerate(query_calls(D, dtype)):
            result[f"D{D}-{dtype}-{number}"] = run_op(op_name, inputs, attributes, threads=2)["block_indices"]
    return result


@pytest.mark.parametrize("isa", native_supported_isas())
def test_quantized_query_rows_on_every_variant(isa, tmp_path):
    """Query rows with NaN, infinities, zeros of both signs, one huge channel, subnormal and tied
    magnitudes, at D up to 1024 and past each 16- and 64-channel step, H = 14 over N = 2, every
    group_reduce: each variant's selection is the reference's."""
    path = tmp_path / "outputs.npz"
    here = pathlib.Path(__file__).resolve().parent
    script = (f"import sys; sys.path[:0] = {[str(here), str(here.parent)]!r}; import numpy as np; "
              f"import test_int8_bounds as t; from quest_ort.ops import native_kernel_isa; "
              f"assert native_kernel_isa() == {isa!r}, native_kernel_isa(); "
              f"np.savez({str(path)!r}, **t.query_outputs())")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "QUEST_ORT_ISA": isa}, cwd=tmp_path)
    got = dict(np.load(path))
    for D, dtype in QUERY_CONFIGS:
        for number, (_, inputs, attributes) in enumerate(query_calls(D, dtype)):
            with np.errstate(all="ignore"):
                want = sparse_block_select(**inputs, **attributes)
            assert_equal(got[f"D{D}-{dtype}-{number}"], want, f"{isa} D{D} {dtype} {attributes['group_reduce']}")


def test_head_dims_past_1024_are_refused():
    """Past D = 1024 an integer bound may reach 2^24: SparseBlockSelect refuses int8 bounds there."""
    _, inputs, attributes = query_calls(1025, "float32")[0]
    with pytest.raises(Exception, match=r"SparseBlockSelect.*D = 1025"):
        run_op("SparseBlockSelect", inputs, attributes)


def test_vnni_scores_int8_bounds_where_the_cpu_has_it():
    """On a CPU with AVX-512 VNNI the integer dot products are the variant in use (and so the one the
    tests above run by default, against avx512's float scoring of the same codes)."""
    flags = pathlib.Path("/proc/cpuinfo").read_text().split() if pathlib.Path("/proc/cpuinfo").exists() else []
    if not {"avx512_vnni", "avx512bw", "avx512f"} <= set(flags):
        pytest.skip("no AVX-512 VNNI on this CPU")
    from quest_ort.ops import native_kernel_isa

    assert native_supported_isas()[0] == "avx512vnni"
    if "QUEST_ORT_ISA" not in os.environ:
        assert native_kernel_isa() == "avx512vnni"
