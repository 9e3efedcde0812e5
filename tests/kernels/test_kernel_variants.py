"""Every kernel variant (scalar, AVX2, AVX-512, NEON under qemu-aarch64) on the conformance cases,
through the kernel-level driver: each SIMD variant must equal the scalar kernel bit for bit, and the
scalar kernel must meet the NumPy reference.

The drivers are built by `make test` (build/driver-native, build/driver-aarch64); the AArch64 one is
cross-compiled with Debian's g++-aarch64-linux-gnu and run with qemu-aarch64.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from support.cases import CALLS, CASES, HIERARCHY_CASES, LONG_CASES, REDUCES, with_specials
from support.driver_cases import outputs_of, read_output, total_lens, write_case
from support.driver_cases import expected as reference_outputs
from support.tolerances import assert_close, assert_equal, assert_used_blocks_equal

REPO = pathlib.Path(__file__).resolve().parents[2]
# QUEST_ORT_NATIVE_DRIVER points at another native build (make test-sanitize: the ASan+UBSan one).
NATIVE_DRIVER = os.environ.get("QUEST_ORT_NATIVE_DRIVER", str(REPO / "build" / "driver-native" / "quest_kernel_driver"))
MACHINES = {
    "native": ([NATIVE_DRIVER], ("scalar",)),
    "aarch64": (["qemu-aarch64", str(REPO / "build" / "driver-aarch64" / "quest_kernel_driver")], ("neon", "scalar")),
}


def _command(machine):
    command, _ = MACHINES[machine]
    binary = pathlib.Path(command[-1])
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: build it with `make drivers` (make test does)")
    if machine == "aarch64" and shutil.which("qemu-aarch64") is None:
        pytest.fail("qemu-aarch64 is missing: `make drivers` installs qemu-user")
    return command


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_variants_match_scalar_and_reference(case, call, machine, tmp_path):
    op_name = CALLS[call][0]
    inputs, attributes, expected = reference_outputs(call, case)
    _check_variants(machine, op_name, case, inputs, attributes, expected, tmp_path)


def _reverse_odd_heads(inputs):
    indices = inputs["block_indices"].copy()
    indices[:, 1::2] = indices[:, 1::2, :, ::-1]
    return dict(inputs, block_indices=indices)


PER_HEAD_CASES = [c for c in CASES if c.reduce == "none" and c.heads[0] > c.heads[1] and c.ranks_blocks()]


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("case", PER_HEAD_CASES[:2], ids=lambda case: case.id)
def test_per_head_lists_in_any_order(case, machine, tmp_path):
    """SIMD attention walks a group's per-head lists as one when each is ascending (as
    SparseBlockSelect writes them); lists in another order (here every other head's reversed) take
    the walk list by list, and both must equal the scalar kernel bit for bit."""
    inputs, attributes, expected = reference_outputs("SparseBlockAttention", case, _reverse_odd_heads)
    _check_variants(machine, "SparseBlockAttention", case, inputs, attributes, expected, tmp_path)


def _check_variants(machine, op_name, case, inputs, attributes, expected, tmp_path):
    total = total_lens(inputs, case)
    write_case(tmp_path, op_name, inputs, attributes, case, total)
    run = subprocess.run([*_command(machine), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    variants = run.stdout.split()
    for required in MACHINES[machine][1]:
        assert required in variants, f"{required} did not run: {variants}"
    if machine == "native":
        from quest_ort.ops import native_supported_isas

        assert set(native_supported_isas()) <= set(variants)
    names = outputs_of(op_name, inputs)
    scalar = {name: read_output(tmp_path, "scalar", name, like) for name, like in zip(names, expected, strict=True)}
    for variant in variants:
        for name, like in zip(names, expected):
            assert_equal(read_output(tmp_path, variant, name, like), scalar[name], f"{variant} {name} vs scalar")
    # The scalar kernel against the reference (unused metadata blocks are unspecified).
    if op_name == "QuestMetadata":
        for name, want in zip(names, expected):
            assert_used_blocks_equal(scalar[name], want, total, case.block_size, name)
    elif op_name == "SparseBlockSelect":  # and the chunks' selections, with chunk queries
        for name, want in zip(names, expected):
            assert_equal(scalar[name], want, name)
    else:  # caches (and int8 caches' scales) bit for bit
        want = dict(zip(names, expected))
        assert_close(scalar["output"], want["output"], np.dtype(case.dtypes[0]), "output")
        for name in names[1:3] + names[4:]:
            assert_equal(scalar[name], want[name], name)
        assert_close(scalar["block_importance"], want["block_importance"], np.float32, "block_importance")


@pytest.mark.parametrize("machine", list(MACHINES))
def test_bounds_round_outward_alike_on_every_variant(machine, tmp_path):
    """float32 keys into float16 bounds (rounded toward +inf into the max, -inf into the min) on
    every variant, specials included: infinities, NaN, signed zeros, subnormals, overflow."""
    import dataclasses

    from support.cases import CASES
    from support.rounding_keys import rounding_keys

    key = rounding_keys()
    S = key.shape[0]
    case = dataclasses.replace(CASES[0], batch=1, heads=(1, 1), head_dim=1, block_size=1, new_tokens=S,
                               dtypes=("float32", "float16"))
    M = case.num_blocks()  # the block count the case folder declares (at least S)
    inputs = dict(key=key.reshape(1, 1, S, 1), block_max=np.zeros((1, 1, M, 1), np.float16),
                  block_min=np.zeros((1, 1, M, 1), np.float16), past_lens=np.zeros(1, np.int32), total_lens=None)
    from quest_ort.ops.reference import quest_metadata

    expected = quest_metadata(**inputs, block_size=1)
    _check_variants(machine, "QuestMetadata", case, inputs, dict(block_size=1), expected, tmp_path)


@pytest.mark.parametrize("call", ["QuestMetadata", "SparseBlockAttention"])
@pytest.mark.parametrize("machine", list(MACHINES))
def test_int8_rows_alike_on_every_variant(machine, call, tmp_path):
    """Rows at the int8 format's edges (zero, tiny, subnormal and tied scales, half-integer values,
    overflow, NaN, infinities) written into int8 caches and attended exactly, and bounded by
    QuestMetadata with key_cache_type 'int8', on every variant."""
    import dataclasses

    from quest_ort.ops.reference import quest_metadata, sparse_block_attention
    from support.rounding_keys import int8_rows

    rows = int8_rows(width=20)  # 20: a 16-lane chunk and a tail
    S, D = rows.shape
    case = dataclasses.replace(CASES[0], batch=1, heads=(2, 1), head_dim=D, block_size=16, new_tokens=S,
                               exact="none", dtypes=("float32", "int8"))
    query = np.random.default_rng(3).standard_normal((1, 2, S, D)).astype(np.float32)
    past = np.zeros(1, np.int32)
    if call == "QuestMetadata":
        M = case.num_blocks()  # the block count the case folder declares
        inputs = dict(key=rows.reshape(1, 1, S, D), block_max=np.zeros((1, 1, M, D), np.float16),
                      block_min=np.zeros((1, 1, M, D), np.float16), past_lens=past, total_lens=None)
        attributes = dict(block_size=case.block_size, key_cache_type="int8")
        expected = quest_metadata(**inputs, **attributes)
    else:
        inputs = dict(query=query, key=rows.reshape(1, 1, S, D), value=rows[::-1].copy().reshape(1, 1, S, D),
                      key_cache=np.zeros((1, 1, S, D), np.int8), value_cache=np.zeros((1, 1, S, D), np.int8),
                      past_lens=past, key_scale=np.zeros((1, 1, S), np.float16),
                      value_scale=np.zeros((1, 1, S), np.float16))
        attributes = dict(num_heads=2, kv_num_heads=1, block_size=case.block_size)
        with np.errstate(invalid="ignore", over="ignore"):
            expected = sparse_block_attention(**inputs, **attributes)
    _check_variants(machine, call, case, inputs, attributes, expected, tmp_path)


def _bounds_no_keys_give(inputs, seed=5):
    """Bounds as any caller may pass them: in half the blocks, each lane's max and min drawn apart
    (so max < min in about half of those lanes); one lane in ten blocks a NaN, an infinity or a
    signed zero; query lanes of +0 and -0, and infinite ones against zero bounds. The SIMD scores take a faster
    path where every lane of a chunk has max >= min and the query no infinity; these take both
    paths, next to each other."""
    rng = np.random.default_rng(seed)
    block_max, block_min = inputs["block_max"].copy(), inputs["block_min"].copy()
    shape = block_max.shape  # [B, N, M, D]
    apart = rng.random(shape[:3]) < 0.5
    block_max[apart] = rng.standard_normal((apart.sum(), shape[3])).astype(block_max.dtype)
    block_min[apart] = rng.standard_normal((apart.sum(), shape[3])).astype(block_min.dtype)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    for bounds in (block_max, block_min):
        hit = np.argwhere(rng.random(shape[:3]) < 0.1)
        lanes = rng.integers(0, shape[3], len(hit))
        for (b, n, m), d in zip(hit, lanes):
            bounds[b, n, m, d] = rng.choice(specials)
    query = inputs["query"].copy()
    query[rng.random(query.shape) < 0.05] = 0.0
    query[rng.random(query.shape) < 0.05] = -0.0
    # Lane 0: infinite in a fifth of the query rows, against bounds (0, -1) and (1, 0) in some blocks,
    # where q * (q > 0 ? max : min) and max(q * max, q * min) differ (NaN against -inf or inf).
    infinite = rng.random(query.shape[:3]) < 0.2
    query[..., 0][infinite] = rng.choice([np.inf, -np.inf], infinite.sum())
    zero_max = rng.random(shape[:3]) < 0.3
    zero_min = ~zero_max & (rng.random(shape[:3]) < 0.3)
    block_max[..., 0][zero_max], block_min[..., 0][zero_max] = 0, -1
    block_max[..., 0][zero_min], block_min[..., 0][zero_min] = 1, 0
    return dict(inputs, block_max=block_max, block_min=block_min, query=query)


BOUND_CASES = [c for c in CASES if c.score == "bound" and c.ranks_blocks()][:8]


# (The int8 cases too: their specials are NaN scale rows and the other edge scales; and the chunk
# queries' cases, but for an int8 one of equal keys: a key scale of 65504 makes every logit of such
# a row one number near 1e5, whose float32 rounding moves the weights by 0.4% from float64's, the
# dense walk's as much as the chunks'.)
SPECIAL_CASES = ([c for c in CASES if c.score == "bound" and not c.int8][:10]
                 + [c for c in CASES if c.int8 and c.chunk == "none"]
                 + [c for c in CASES if c.chunk != "none" and not (c.int8 and c.equal_scores)])
EDGE_INPUTS = {"no keys give": _bounds_no_keys_give, "non-finite": with_specials, "as built": None}
# (call, case, inputs) runs at the contract's edges: bounds no keys give on short selections;
# non-finite numbers on every call; rows of thousands of blocks, which take the paths short
# ones do not (tiles of four blocks, the floor that skips low scores), as QuestMetadata builds them
# and with both kinds of edge; the hierarchical selection's edges, as built and non-finite.
EDGE_RUNS = ([("SparseBlockSelect", case, "no keys give") for case in BOUND_CASES]
             + [(call, case, "non-finite") for case in SPECIAL_CASES for call in CALLS]
             + [("SparseBlockSelect", case, inputs) for case in LONG_CASES for inputs in EDGE_INPUTS
                if not (case.int8_bounds and inputs == "no keys give")]  # float bounds' edge (int8: INT8_BOUND_DIMS)
             + [("SparseBlockSelect", case, inputs) for case in HIERARCHY_CASES for inputs in ("as built", "non-finite")])


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("call,case,inputs", EDGE_RUNS, ids=[f"{call}-{case.id}-{inputs}" for call, case, inputs in EDGE_RUNS])
def test_variants_alike_at_the_edges(call, case, inputs, machine, tmp_path):
    """Every variant writes the same bits as the scalar kernel (NaN payloads and signs included,
    docs/ops.md non-finite numbers), and the scalar kernel meets the reference."""
    inputs, attributes, expected = reference_outputs(call, case, EDGE_INPUTS[inputs])
    _check_variants(machine, CALLS[call][0], case, inputs, attributes, expected, tmp_path)


# int8 block bounds (docs/ops.md, int8 block bounds): head dims around the 16-lane chunks, and
# exponents at their edges as inputs (subnormal scales, the lowest a block quantizes to, scales
# whose products overflow, the non-finite block).
INT8_BOUND_DIMS = (1, 15, 16, 17, 64, 80, 128)
EDGE_EXPONENTS = np.array([-128, -127, -126, 10, 126, 127], np.int8)


def _int8_bound_case(head_dim, key_dtype, reduce="none", top_k="8", heads=(14, 2)):
    """Three rows of different lengths (the last padded), H = 14 over N = 2 unless told, P = 4:
    hundreds of blocks in the first row, one or two in the others."""
    import dataclasses

    return dataclasses.replace(CASES[0], batch=3, heads=heads, head_dim=head_dim, block_size=4, cached="~1000",
                               new_tokens=7, top_k=top_k, sink=1, recent=1, reduce=reduce, importance=False,
                               equal_scores=False, score="bound", dtypes=(key_dtype, "int8"), exact="none")


def _keys(rng, shape, dtype):
    """Keys of magnitudes 1e-4 to 1e4 (so exponents differ by block), with specials in some rows:
    NaN, infinities, values past float16's range or at its edge, float16 subnormals."""
    magnitude = 10.0 ** rng.uniform(-4, 4, shape[:-1] + (1,))
    key = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 7e4, -7e4, 65504, 65505, 3e-8, -3e-8, 0.0, -0.0], np.float32)
    rows = np.argwhere(rng.random(shape[:-1]) < 0.05)
    for row in rows:
        key[tuple(row) + (int(rng.integers(shape[-1])),)] = rng.choice(specials)
    with np.errstate(over="ignore"):
        return key.astype(dtype)


def _held_bounds(rng, shape):
    """Codes and exponents as any caller may hold them: codes over all of int8 (max < min in a tenth
    of the blocks), exponents around 0 and at their edges."""
    a, b = rng.integers(-128, 128, shape), rng.integers(-128, 128, shape)
    block_max, block_min = np.maximum(a, b).astype(np.int8), np.minimum(a, b).astype(np.int8)
    swap = rng.random(shape[:3]) < 0.1
    block_max[swap], block_min[swap] = block_min[swap], block_max[swap]
    exponent = rng.integers(-14, 6, shape[:3]).astype(np.int8)
    edges = rng.random(shape[:3]) < 0.4
    exponent[edges] = rng.choice(EDGE_EXPONENTS, int(edges.sum()))
    return block_max, block_min, exponent


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("key_cache_type", ["float", "int8"])
@pytest.mark.parametrize("key_dtype", ["float32", "float16"])
@pytest.mark.parametrize("head_dim", INT8_BOUND_DIMS)
def test_int8_bounds_metadata_alike_on_every_variant(head_dim, key_dtype, key_cache_type, machine, tmp_path):
    """QuestMetadata into int8 bounds: held codes dequantized (edge exponents, overflowing products,
    non-finite blocks), non-finite and out-of-range keys merged, blocks quantized; every variant
    writes the scalar kernel's bits, and the scalar kernel the reference's."""
    from quest_ort.ops.reference import quest_metadata

    case = _int8_bound_case(head_dim, key_dtype)
    rng = np.random.default_rng(head_dim * 4 + (key_dtype == "float16") * 2 + (key_cache_type == "int8"))
    B, (_, N), S, M = case.batch, case.heads, case.new_tokens, case.num_blocks()
    block_max, block_min, exponent = _held_bounds(rng, (B, N, M, head_dim))
    inputs = dict(key=_keys(rng, (B, N, S, head_dim), key_dtype), block_max=block_max, block_min=block_min,
                  past_lens=case.past_lens(), total_lens=case.total_lens(), block_exponent=exponent)
    attributes = dict(block_size=case.block_size, key_cache_type=key_cache_type)
    with np.errstate(all="ignore"):
        expected = quest_metadata(**inputs, **attributes)
    _check_variants(machine, "QuestMetadata", case, inputs, attributes, expected, tmp_path)
    # Blocks the call does not touch keep their input bits (not only the used ones compared above).
    for name, want in zip(outputs_of("QuestMetadata", inputs), expected, strict=True):
        assert_equal(read_output(tmp_path, "scalar", name, want), want, f"{name}, every block")


def _built_int8_bounds(rng, case, key_dtype):
    """int8 bounds as QuestMetadata builds them over every row's cached keys, then edge exponents
    in a fifth of the blocks and the codes of a tenth swapped (max < min: the general score form)."""
    from quest_ort.ops.reference import quest_metadata

    B, (_, N), M, D, P = case.batch, case.heads, case.num_blocks(), case.head_dim, case.block_size
    zeros = np.zeros((B, N, M, D), np.int8)
    keys = _keys(rng, (B, N, M * P, D), key_dtype)
    with np.errstate(all="ignore"):
        block_max, block_min, exponent = quest_metadata(keys, zeros, zeros, np.zeros(B, np.int32), block_size=P,
                                                        block_exponent=np.zeros((B, N, M), np.int8))
    edges = rng.random((B, N, M)) < 0.2
    exponent = exponent.copy()
    exponent[edges] = rng.choice(EDGE_EXPONENTS, int(edges.sum()))
    swap = rng.random((B, N, M)) < 0.1
    block_max, block_min = block_max.copy(), block_min.copy()
    block_max[swap], block_min[swap] = block_min[swap], block_max[swap]
    return block_max, block_min, exponent


# Groups of 7 (tiles of four rows and three) and of 2 (rows scored two blocks at a time on AVX2).
INT8_SELECT_RUNS = ([(D, reduce, "8", (14, 2)) for D in INT8_BOUND_DIMS for reduce in REDUCES]
                    + [(D, reduce, "more than eligible", (14, 2)) for D in (17, 128) for reduce in REDUCES]
                    + [(D, reduce, "8", (4, 2)) for D in (17, 64, 128) for reduce in REDUCES])


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("key_dtype", ["float32", "float16"])
@pytest.mark.parametrize("head_dim,reduce,top_k,heads", INT8_SELECT_RUNS,
                         ids=[f"D{d}-{r}-K{k.split()[0]}-H{h[0]}" for d, r, k, h in INT8_SELECT_RUNS])
def test_int8_bounds_select_alike_on_every_variant(head_dim, reduce, top_k, heads, key_dtype, machine, tmp_path):
    """SparseBlockSelect over int8 bounds (codes scored, the reduced score scaled by 2^e, NaN for a
    non-finite block): decode and prefill queries of rows of different lengths, on every variant."""
    from quest_ort.ops.reference import sparse_block_select

    case = _int8_bound_case(head_dim, key_dtype, reduce, top_k, heads)
    rng = np.random.default_rng(head_dim * 8 + REDUCES.index(reduce) * 2 + (key_dtype == "float16"))
    block_max, block_min, exponent = _built_int8_bounds(rng, case, key_dtype)
    H, N = case.heads
    query = rng.standard_normal((case.batch, H, case.new_tokens, head_dim)).astype(key_dtype)
    query[rng.random(query.shape) < 0.05] = 0.0
    query[:, H - 1, 2] = 0.0  # rows of zeros: the last head of a group (scored without dot products
    query[:, 0, 4] = 0.0  # where nothing after it is nonzero) and the first
    inputs = dict(query=query, block_max=block_max, block_min=block_min, past_lens=case.past_lens(),
                  total_lens=case.total_lens(), block_exponent=exponent)
    attributes = dict(num_heads=H, kv_num_heads=N, block_size=case.block_size, top_k=case.k(),
                      sink_blocks=case.sink, recent_blocks=case.recent, group_reduce=reduce)
    with np.errstate(all="ignore"):
        expected = (sparse_block_select(**inputs, **attributes),)
    _check_variants(machine, "SparseBlockSelect", case, inputs, attributes, expected, tmp_path)
