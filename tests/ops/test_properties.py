"""Property-based tests (hypothesis): random shapes, lengths, block sizes, budgets and dtypes.

Valid calls: the native kernels agree with the NumPy reference (selections and cache writes bit for
bit, attention within the dtype tolerance). Malformed calls run in batches in a subprocess
(`malformed_runner.py`), so a crash is caught and reported with the case that caused it; each must
come back as an error naming the input or attribute at fault.
"""

from __future__ import annotations

import json
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from quest_ort.ops.reference import quest_metadata, sparse_block_attention, sparse_block_select
from quest_ort.ops.reference.int8_bounds import NON_FINITE, dequantize
from quest_ort.ops.reference.int8_rows import dequantize_rows, quantize_rows
from quest_ort.ops.reference.quest_metadata import rounded_outward
from quest_ort.ops.reference.sparse_block_select import bound_scores
from quest_ort.ops.schemas import OPS_BY_NAME, TYPE_VARS
from quest_ort.runtime.single_op import run_op
from support.cases import SCALE_SPECIALS, SCALES, sprinkle_specials
from support.driver_cases import outputs_of
from support.impls import EACH_IMPLEMENTATION, run
from support.tolerances import assert_close, assert_equal, assert_used_blocks_equal

# (activation, cache): int8 caches keep float16 bounds (cases.INT8_DTYPES).
DTYPES = (("float32", "float32"), ("float16", "float16"), ("float32", "float16"), ("float16", "float32"),
          ("float32", "int8"), ("float16", "int8"))
# Head dims around the 16-lane SIMD width and its tails, plus the model sizes.
HEAD_DIMS = (1, 3, 8, 15, 16, 17, 33, 64, 80)
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def calls(draw):
    """One consistent call: geometry, per-row lengths, a cache with its metadata, the new tokens."""
    N, G = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    D = draw(st.sampled_from(HEAD_DIMS))
    # Sometimes the largest block size allowed: one block larger than any cache.
    P = 2**31 - 1 if draw(st.sampled_from((False,) * 7 + (True,))) else draw(st.integers(1, 40))
    B, S = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    past = np.array(draw(st.lists(st.integers(0, 120), min_size=B, max_size=B)), np.int32)
    valid = np.array([draw(st.integers(0, S)) for _ in range(B)], np.int32)
    explicit_total = draw(st.booleans()) or bool((valid < S).any())
    C = int(past.max()) + S + draw(st.integers(0, min(P, 40)))
    M = -(-C // P)
    act, cache = (np.dtype(t) for t in draw(st.sampled_from(DTYPES)))
    int8 = cache == np.int8
    bounds, drawn = (np.dtype(np.float16), np.dtype(np.float32)) if int8 else (cache, cache)
    pattern = draw(st.sampled_from(("normal", "normal", "zeros", "equal", "specials")))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))

    def normal(shape, dtype):
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)

    key_cache, key = normal((B, N, C, D), drawn), normal((B, N, S, D), act)
    if pattern == "zeros":  # zero-filled blocks: every bound is 0, every ranking a tie
        key_cache[:], key[:] = 0, 0
    elif pattern == "equal":
        row = normal((D,), np.float32)
        key_cache[:], key[:] = row.astype(drawn), row.astype(act)
    garbage = normal((B, N, M, D), bounds)
    query, value, value_cache = normal((B, N * G, S, D), act), normal((B, N, S, D), act), normal((B, N, C, D), drawn)
    if pattern == "specials":
        for array in (query, key, value, key_cache, value_cache):
            sprinkle_specials(array, rng)
    # int8 caches: the drawn rows quantized, with their scales (an int8 cache's specials are its scales).
    scales = {}
    if int8:
        key_cache, scales["key_scale"] = quantize_rows(key_cache)
        value_cache, scales["value_scale"] = quantize_rows(value_cache)
        if pattern == "specials":
            for name in SCALES:
                sprinkle_specials(scales[name], rng, specials=SCALE_SPECIALS)
    held = dequantize_rows(key_cache, scales["key_scale"]) if int8 else key_cache  # the keys the cache holds
    block_max, block_min = quest_metadata(held[:, :, : max(int(past.max()), 1)], garbage, garbage.copy(),
                                          np.zeros(B, np.int32), past, block_size=P)
    importance = None
    if draw(st.booleans()):
        importance = np.round(rng.random((B, N, M)), 1).astype(np.float32)
    # int8 block bounds, drawn last so that every earlier draw stays as it was: the same keys'
    # metadata as codes and exponents (unused blocks any codes and exponents).
    exponent = None
    if draw(st.sampled_from((False, False, False, True))):
        garbage = rng.integers(-128, 128, (B, N, M, D), dtype=np.int8)
        block_max, block_min, exponent = quest_metadata(
            held[:, :, : max(int(past.max()), 1)], garbage, garbage.copy(), np.zeros(B, np.int32), past,
            rng.integers(-128, 128, (B, N, M), dtype=np.int8), block_size=P)
    select = dict(top_k=draw(st.integers(1, M + 3)), sink_blocks=draw(st.integers(0, 3)),
                  recent_blocks=draw(st.integers(0, 3)), group_reduce=draw(st.sampled_from(("mean", "max", "none"))),
                  importance_fraction=draw(st.sampled_from((0.0, 0.25, 0.5, 1.0))),
                  # the probe reads float key caches only, and needs float bounds
                  score=draw(st.sampled_from(("bound",) if int8 else ("bound", "probe"))),
                  num_probes=draw(st.integers(1, 9)))
    if exponent is not None:
        select["score"] = "bound"
    return dict(
        heads=(N * G, N), block_size=P, new_tokens=S, num_blocks=M, act=act, int8=int8,
        query=query, key=key, value=value,
        key_cache=key_cache, value_cache=value_cache, block_max=block_max, block_min=block_min,
        key_scale=scales.get("key_scale"), value_scale=scales.get("value_scale"),
        past_lens=past, total_lens=(past + valid).astype(np.int32) if explicit_total else None,
        block_importance=importance, block_exponent=exponent, pattern=pattern, select=select,
    )


ATTENTION_INPUTS = ("query", "key", "value", "key_cache", "value_cache", "past_lens", "total_lens", *SCALES)


def _metadata_args(call):
    inputs = {k: call[k] for k in ("key", "block_max", "block_min", "past_lens", "total_lens", "block_exponent")}
    return inputs, dict(block_size=call["block_size"], **(dict(key_cache_type="int8") if call["int8"] else {}))


def _select_args(call):
    inputs, attributes = _metadata_args(call)
    block_max, block_min, *exponent = quest_metadata(**inputs, **attributes)
    H, N = call["heads"]
    probe = call["select"]["score"] == "probe"
    return (dict(query=call["query"], block_max=block_max, block_min=block_min, past_lens=call["past_lens"],
                 total_lens=call["total_lens"], block_importance=call["block_importance"],
                 key_cache=call["key_cache"] if probe else None, key=call["key"] if probe else None,
                 block_exponent=exponent[0] if exponent else None),
            dict(num_heads=H, kv_num_heads=N, block_size=call["block_size"], **call["select"]))


@PROPERTY_SETTINGS
@given(calls())
def test_metadata_agrees_with_the_reference(call):
    inputs, attributes = _metadata_args(call)
    expected = quest_metadata(**inputs, **attributes)
    got = run_op("QuestMetadata", inputs, attributes)
    total = call["total_lens"] if call["total_lens"] is not None else call["past_lens"] + call["new_tokens"]
    for name, want in zip(outputs_of("QuestMetadata", inputs), expected, strict=True):
        channels = (...,) if want.ndim == 4 else (..., None)  # an exponent as its block's one channel
        assert_used_blocks_equal(got[name][channels], want[channels], total, call["block_size"], name)


# ---- int8 block bounds, through every implementation ---------------------------------------
# Fewer examples: the function bodies build a session per call.
INT8_BOUNDS_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=40)


def _int8_bounds(call):
    """Only calls with int8 bounds (a quarter of the draws)."""
    return call["block_exponent"] is not None


def _total(call):
    return call["total_lens"] if call["total_lens"] is not None else call["past_lens"] + call["new_tokens"]


@EACH_IMPLEMENTATION
@INT8_BOUNDS_SETTINGS
@given(call=calls().filter(_int8_bounds))
def test_int8_bounds_hold_every_key(impl, call):
    """The upper-bound property: every valid key, rounded outward to float16 (so also every value a
    float16 or finer cache holds), lies within its block's dequantized bounds; a block with a
    non-finite key is marked non-finite."""
    inputs, attributes = _metadata_args(call)
    got = run(impl, "QuestMetadata", inputs, attributes, outputs=outputs_of("QuestMetadata", inputs))
    codes_max, codes_min, exponent = (got[name] for name in outputs_of("QuestMetadata", inputs))
    hi, lo = dequantize(codes_max, exponent), dequantize(codes_min, exponent)
    key = dequantize_rows(*quantize_rows(call["key"])) if call["int8"] else call["key"]
    above, below = (bound.astype(np.float32) for bound in rounded_outward(key, np.float16))
    past, P = call["past_lens"], call["block_size"]
    for b in range(len(past)):
        for i in range(int(_total(call)[b]) - int(past[b])):
            m = (int(past[b]) + i) // P
            bad = ~(np.isfinite(above[b, :, i]).all(-1) & np.isfinite(below[b, :, i]).all(-1))  # [N]
            assert (exponent[b, bad, m] == NON_FINITE).all(), (b, i, "a non-finite key's block is not marked")
            good = exponent[b, :, m] != NON_FINITE
            assert (hi[b, good, m] >= above[b, good, i]).all() and (lo[b, good, m] <= below[b, good, i]).all(), (b, i)


@EACH_IMPLEMENTATION
@INT8_BOUNDS_SETTINGS
@given(call=calls().filter(_int8_bounds), cuts=st.lists(st.integers(1, 8), max_size=4))
def test_int8_bounds_do_not_depend_on_chunking(impl, call, cuts):
    """A call's keys brought in chunks (each a call of its own, its lengths clipped to the chunk)
    give the bits of one call: the reference defines it, and every implementation meets it."""
    inputs, attributes = _metadata_args(call)
    names = outputs_of("QuestMetadata", inputs)
    whole = run(impl, "QuestMetadata", inputs, attributes, outputs=names)
    S, past, total = call["new_tokens"], call["past_lens"], _total(call).astype(np.int32)
    edges = sorted({0, S, *(cut for cut in np.cumsum(cuts) if cut < S)})
    state = {name: inputs[name] for name in ("block_max", "block_min", "block_exponent")}
    for start, end in zip(edges, edges[1:]):
        chunk = dict(key=np.ascontiguousarray(call["key"][:, :, start:end]), past_lens=(past + start).astype(np.int32),
                     total_lens=np.clip(total, past + start, past + end).astype(np.int32), **state)
        got = run(impl, "QuestMetadata", chunk, attributes, outputs=names)
        state = dict(zip(("block_max", "block_min", "block_exponent"), (got[name] for name in names)))
    for name, array in zip(names, state.values()):
        assert_equal(array, whole[name], name)


@INT8_BOUNDS_SETTINGS
@given(call=calls().filter(lambda call: _int8_bounds(call) and call["pattern"] != "specials"))
def test_int8_scores_are_the_dequantized_bound_within_the_query_rounding(call):
    """int8 bounds score each row quantized to 7-bit magnitudes: every block's score is the float
    bound over the dequantized bounds within what the rounding moves it (each |q - q'| <= a / 254,
    times the channel's largest bound), plus float32 rounding. The selection every implementation
    makes from these scores is the reference's (test_selection_agrees_with_the_reference)."""
    inputs, attributes = _select_args(call)
    H, N = call["heads"]
    reduce = attributes["group_reduce"]
    bounds, exponent = (inputs["block_max"], inputs["block_min"]), inputs["block_exponent"]
    if reduce == "none":  # each query head alone: the "mean" of one head over its KV head's bounds
        bounds = tuple(np.repeat(b, H // N, axis=1) for b in bounds)
        exponent, N, reduce = np.repeat(exponent, H // N, axis=1), H, "mean"
    scores = bound_scores(inputs["query"], *bounds, N, reduce, exponent)
    plain = bound_scores(inputs["query"], *(dequantize(b, exponent) for b in bounds), N, reduce)
    rows = inputs["query"].astype(np.float32).reshape(inputs["query"].shape[0], N, H // N, *inputs["query"].shape[2:])
    if reduce == "mean":  # the mean row is the one quantized (its largest magnitude bounds the sum's)
        rows = rows.mean(2, keepdims=True, dtype=np.float32)
    a = np.abs(rows).max(-1).max(2)  # [B, N, S]: the largest row magnitude of each score
    largest = np.maximum(*(np.abs(dequantize(b, exponent)) for b in bounds)).sum(-1)  # [B, N, M]
    slack = (a[..., None] / 254) * largest[:, :, None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(scores - plain)
        within = error <= slack * 1.001 + 1e-4 * a[..., None] * largest[:, :, None, :] + 1e-30
    same = (scores == plain) | (np.isnan(scores) & np.isnan(plain))  # zeros, infinities, NaN blocks
    overflowed = ~np.isfinite(plain)  # float bounds past float32's range: the integers still score them
    bad = ~(within | same | overflowed)
    assert_equal(bad, np.zeros_like(bad), f"scores past the query rounding's reach (first: {scores[bad][:1]} against "
                 f"{plain[bad][:1]}, slack {slack[bad][:1]})", axes="blocks")


@PROPERTY_SETTINGS
@given(calls())
def test_selection_agrees_with_the_reference(call):
    inputs, attributes = _select_args(call)
    expected = sparse_block_select(**inputs, **attributes)
    assert_equal(run_op("SparseBlockSelect", inputs, attributes)["block_indices"], expected, "block_indices")


@PROPERTY_SETTINGS
@given(calls(), st.booleans())
def test_attention_agrees_with_the_reference(call, sparse):
    indices = None
    if sparse:
        inputs, attributes = _select_args(call)
        indices = sparse_block_select(**inputs, **attributes)
    H, N = call["heads"]
    inputs = {k: call[k] for k in ATTENTION_INPUTS}
    inputs["block_indices"] = indices
    attributes = dict(num_heads=H, kv_num_heads=N, block_size=call["block_size"])
    names = outputs_of("SparseBlockAttention", inputs)
    expected = dict(zip(names, sparse_block_attention(**inputs, **attributes), strict=True))
    got = run_op("SparseBlockAttention", inputs, attributes, outputs=names)
    assert_close(got["output"], expected["output"], call["act"], "output")
    for name in names[1:3] + names[4:]:  # the caches, and int8 caches' scales, bit for bit
        assert_equal(got[name], expected[name], name)
    assert_close(got["block_importance"], expected["block_importance"], np.float32, "block_importance")


# ---- malformed calls -------------------------------------------------------------------------

RUNNER = pathlib.Path(__file__).resolve().parents[1] / "support" / "malformed_runner.py"
OPS = ("QuestMetadata", "SparseBlockSelect", "SparseBlockAttention")


def _valid_inputs(call, op_name):
    """A valid call of `op_name` (inputs, attributes) built from a drawn `calls()` example."""
    if op_name == "QuestMetadata":
        return _metadata_args(call)
    if op_name == "SparseBlockSelect":
        return _select_args(call)
    H, N = call["heads"]
    inputs = {k: call[k] for k in ATTENTION_INPUTS}
    select_inputs, select_attributes = _select_args(call)
    inputs["block_indices"] = sparse_block_select(**select_inputs, **select_attributes)
    return inputs, dict(num_heads=H, kv_num_heads=N, block_size=call["block_size"])


def _symbol_holders(op_name: str, inputs: dict) -> dict[str, list[tuple[str, int]]]:
    """Dim symbol -> (present input, axis) pairs that carry it, from the schema."""
    holders: dict[str, list[tuple[str, int]]] = {}
    for tensor in OPS_BY_NAME[op_name].inputs:
        if inputs.get(tensor.name) is not None:
            for axis, symbol in enumerate(tensor.dims):
                holders.setdefault(symbol, []).append((tensor.name, axis))
    return holders


BAD_ATTRIBUTES = {
    "block_size": (0, -3), "num_heads": ("+1",), "kv_num_heads": (0, "+1"), "top_k": (0, -1), "sink_blocks": (-2,),
    "recent_blocks": (-1,), "importance_fraction": (1.5, -0.25, float("nan")), "num_probes": (0,),
    "group_reduce": ("median",), "score": ("guess",), "scale": (-1.0,),
}


@st.composite
def malformed_calls(draw):
    """A valid call with one thing broken that the contract forbids, and the names its error may
    mention (the broken input, or the one it disagrees with)."""
    call = draw(calls())
    op_name = draw(st.sampled_from(OPS))
    inputs, attributes = _valid_inputs(call, op_name)
    spec = OPS_BY_NAME[op_name]
    kinds = ["dim", "rank", "foreign_dtype", "mixed_dtype", "negative_length", "long_length", "short_total",
             "attribute"] + (["index"] if inputs.get("block_indices") is not None else [])
    kind = draw(st.sampled_from(kinds))
    present = [t for t in spec.inputs if inputs.get(t.name) is not None]
    lengths = [n for n in ("past_lens", "total_lens") if inputs.get(n) is not None]
    names: tuple[str, ...]
    if kind == "dim":  # a dim that another input (or an attribute) also fixes
        holders = _symbol_holders(op_name, inputs)
        shared = sorted(s for s, h in holders.items() if len(h) > 1 or s in spec.symbol_attrs)
        symbol = draw(st.sampled_from(shared))
        name, axis = draw(st.sampled_from(holders[symbol]))
        shape = list(inputs[name].shape)
        shape[axis] += draw(st.sampled_from((1, 5)))
        inputs[name] = np.zeros(shape, inputs[name].dtype)
        names = tuple(n for n, _ in holders[symbol]) + ((spec.symbol_attrs[symbol],) if symbol in spec.symbol_attrs else ())
    elif kind == "rank":
        name = draw(st.sampled_from([t.name for t in present]))
        value = inputs[name]
        flatten = value.ndim > 1 and draw(st.booleans())
        inputs[name] = value.reshape(-1) if flatten else value.reshape(*value.shape, 1)
        names = (name,)
    elif kind == "foreign_dtype":  # a type the input never takes
        tensor = draw(st.sampled_from(present))
        foreign = (np.int64, np.float32) if tensor.elem == "int32" else (
            (np.float64, np.int32, np.float16) if tensor.elem == "float32" else (np.float64, np.int32, np.int64))
        inputs[tensor.name] = inputs[tensor.name].astype(draw(st.sampled_from(foreign)))
        names = (tensor.name,)
    elif kind == "mixed_dtype":  # float16 where another input of the same type variable is float32
        shared = [t for t in present if t.elem in TYPE_VARS and sum(u.elem == t.elem for u in present) > 1]
        if not shared:
            return draw(malformed_calls())
        tensor = draw(st.sampled_from(shared))
        value = inputs[tensor.name]
        inputs[tensor.name] = value.astype(np.float16 if value.dtype == np.float32 else np.float32)
        names = tuple(t.name for t in present if t.elem == tensor.elem)
    elif kind in ("negative_length", "long_length"):
        name = draw(st.sampled_from(lengths))
        broken = inputs[name].copy()
        # Past the op's limit: C, or M * P (which may itself exceed int32 with P = 2^31 - 1: then
        # no length is too long, and another call is drawn).
        limit = (inputs["key_cache"].shape[2] if op_name == "SparseBlockAttention"
                 else inputs["block_max"].shape[2] * call["block_size"])
        if kind == "long_length" and limit >= 2**31 - 1:
            return draw(malformed_calls())
        bad = (-1, -7, -(2**31)) if kind == "negative_length" else (min(10**6, limit + 1), 2**31 - 1)
        broken[draw(st.integers(0, broken.size - 1))] = draw(st.sampled_from(bad))
        inputs[name] = broken
        names = ("past_lens", "total_lens")  # a long past_lens may first fail total_lens >= past_lens
    elif kind == "short_total":
        past = inputs["past_lens"]
        if (past == 0).all():
            return draw(malformed_calls())
        total = (past + 0).astype(np.int32)
        total[int(np.argmax(past))] -= 1
        inputs["total_lens"], names = total, ("total_lens",)
    elif kind == "attribute":
        name = draw(st.sampled_from([a.name for a in spec.attributes if a.name in BAD_ATTRIBUTES]))
        broken = draw(st.sampled_from(BAD_ATTRIBUTES[name]))
        if broken == "+1":
            broken = attributes[name] + 1
        attributes = {**attributes, name: broken}
        names = ("num_heads", "kv_num_heads", "query") if name in ("num_heads", "kv_num_heads") else (name,)
    else:  # a block index out of range, or repeated
        indices = inputs["block_indices"].copy()
        flat = indices.reshape(-1, indices.shape[-1])
        row = draw(st.integers(0, flat.shape[0] - 1))
        if flat.shape[1] > 1 and draw(st.booleans()):
            flat[row, :2] = call["num_blocks"] - 1
        else:
            flat[row, 0] = draw(st.sampled_from((call["num_blocks"], call["num_blocks"] + 9, -2, 2**31 - 1)))
        inputs["block_indices"], names = indices, ("block_indices",)
    # Every output the valid call has (an int8 call's scales too), so only the broken thing is wrong.
    outputs = outputs_of(op_name, inputs)
    return dict(op=op_name, inputs=inputs, attributes=attributes, outputs=outputs, kind=kind, names=names)


def _run_batch(cases, tmp_path) -> list[dict]:
    batch = tmp_path / "cases.pkl"
    results = tmp_path / "results.json"
    batch.write_bytes(pickle.dumps(cases))
    process = subprocess.run([sys.executable, str(RUNNER), str(batch), str(results)], capture_output=True, text=True,
                             timeout=600)
    if process.returncode != 0:
        started = [line for line in process.stdout.splitlines() if line.startswith("case ")]
        culprit = cases[int(started[-1].split()[1])] if started else None
        pytest.fail(f"the runner died (exit {process.returncode}) on "
                    f"{culprit and {k: culprit[k] for k in ('op', 'kind', 'names', 'attributes')}}\n"
                    f"{process.stderr[-3000:]}")
    return json.loads(results.read_text())


# No shrinking: each attempt costs a process, and the failure message names the case already.
@settings(max_examples=10, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(cases=st.lists(malformed_calls(), min_size=30, max_size=30))
def test_malformed_calls_fail_cleanly_naming_the_culprit(cases, tmp_path):
    for case, result in zip(cases, _run_batch(cases, tmp_path)):
        where = f"{case['op']} with a broken {case['kind']} (expected a name among {case['names']})"
        assert result["error"] is not None, f"{where} was accepted"
        assert any(name in result["error"] for name in case["names"]), f"{where}: {result['error']}"
