"""In-place cache updates through IOBinding: a decode step writes only the new tokens (and, with int8
caches, their scales; with int8 bounds, their blocks' exponents), copies nothing, and a failing step
leaves the bound caches exactly as they were."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from quest_ort.graphs import op_model
from quest_ort.ops import native_copied_bytes
from quest_ort.ops.reference import quest_metadata, sparse_block_attention
from quest_ort.ops.reference.int8_rows import quantize_rows
from quest_ort.runtime import make_session
from quest_ort.runtime.binding import InPlaceStep
from support.driver_cases import SCALE_OUTPUTS
from support.tolerances import assert_close, assert_equal

B, H, N, D, P, C = 2, 8, 2, 64, 16, 256
ATTENTION = dict(num_heads=H, kv_num_heads=N, block_size=P)
# The caches a step keeps: float32, or int8 with each row's float16 scale (kept in place as well).
CACHE_KINDS = ("float32", "int8")
IN_PLACE = {"key_cache_out": "key_cache", "value_cache_out": "value_cache", "key_scale_out": "key_scale",
            "value_scale_out": "value_scale"}


def _attention_session(cache="float32"):
    x = dict(query=np.zeros((B, H, 1, D), np.float32), key=np.zeros((B, N, 1, D), np.float32),
             value=np.zeros((B, N, 1, D), np.float32), key_cache=np.zeros((B, N, C, D), cache),
             value_cache=np.zeros((B, N, C, D), cache), past_lens=np.zeros(B, np.int32))
    outputs = None
    if cache == "int8":
        x.update(key_scale=np.zeros((B, N, C), np.float16), value_scale=np.zeros((B, N, C), np.float16))
        outputs = ("output", "key_cache_out", "value_cache_out", *SCALE_OUTPUTS)
    session = make_session(op_model("SparseBlockAttention", x, ATTENTION, outputs=outputs))
    return InPlaceStep(session, IN_PLACE)  # (the scale aliases apply only where the outputs exist)


def _caches(rng, cache="float32") -> dict:
    """The cache inputs of a step: float32 caches, or the same draws quantized into int8 caches
    with their scales."""
    key_cache = rng.standard_normal((B, N, C, D)).astype(np.float32)
    value_cache = rng.standard_normal((B, N, C, D)).astype(np.float32)
    if cache == "float32":
        return dict(key_cache=key_cache, value_cache=value_cache)
    (key_cache, key_scale), (value_cache, value_scale) = quantize_rows(key_cache), quantize_rows(value_cache)
    return dict(key_cache=key_cache, value_cache=value_cache, key_scale=key_scale, value_scale=value_scale)


def _decode_feeds(rng, past, caches):
    return dict(query=rng.standard_normal((B, H, 1, D)).astype(np.float32),
                key=rng.standard_normal((B, N, 1, D)).astype(np.float32),
                value=rng.standard_normal((B, N, 1, D)).astype(np.float32),
                **caches, past_lens=np.array(past, np.int32))


def _reference_step(feeds, caches) -> tuple[np.ndarray, dict]:
    """(output, the caches after the step) of the reference."""
    output, key_cache, value_cache, _, *scales = sparse_block_attention(
        feeds["query"], feeds["key"], feeds["value"], past_lens=feeds["past_lens"], **caches, **ATTENTION)
    return output, dict(zip(caches, (key_cache, value_cache, *scales), strict=True))


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_decode_steps_update_the_bound_caches_in_place(cache):
    rng = np.random.default_rng(0)
    caches = _caches(rng, cache)
    expected = {name: array.copy() for name, array in caches.items()}
    values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in caches.items()}
    pointers = {name: value.data_ptr() for name, value in values.items()}
    step = _attention_session(cache)
    past = [100, 37]
    copied_before = native_copied_bytes()
    for _ in range(3):
        feeds = _decode_feeds(rng, past, values)
        out = step.run(feeds)["output"]
        reference, expected = _reference_step(feeds, expected)
        assert_close(out, reference, np.float32, "output")
        past = [p + 1 for p in past]
    assert native_copied_bytes() == copied_before, "an in-place step copied a cache"
    assert {name: value.data_ptr() for name, value in values.items()} == pointers
    # The caller's own buffers hold exactly the reference caches (and scales): only rows 100..102 /
    # 37..39 changed.
    for name, array in caches.items():
        assert_equal(array, expected[name], name)


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_unbound_outputs_copy_the_cache_once_per_step(cache):
    rng = np.random.default_rng(1)
    caches = _caches(rng, cache)
    session = _attention_session(cache).session
    feeds = _decode_feeds(rng, [3, 4], caches)
    copied_before = native_copied_bytes()
    session.run(None, feeds)
    assert native_copied_bytes() - copied_before == sum(array.nbytes for array in caches.values())


def _read_only(shape):
    array = np.zeros(shape, np.float32)
    array.flags.writeable = False
    return array


REFUSED_OUTPUT_ARRAYS = {
    "not contiguous": lambda shape: np.zeros((*shape[:-1], 2 * shape[-1]), np.float32)[..., ::2],
    "read-only": _read_only,
}


def test_outputs_are_written_into_the_arrays_given():
    rng = np.random.default_rng(5)
    step = _attention_session()
    feeds = _decode_feeds(rng, [3, 4], _caches(rng))
    expected = step.run(feeds)["output"]  # run again, the step writes the same new tokens again
    output = np.full(expected.shape, np.nan, np.float32)
    got = step.run(feeds, into={"output": output})["output"]
    assert got is output
    np.testing.assert_array_equal(output, expected)


@pytest.mark.parametrize("kind", REFUSED_OUTPUT_ARRAYS)
def test_an_array_onnx_runtime_would_not_write_into_is_refused(kind):
    # ONNX Runtime writes a contiguous copy of any other array and leaves the caller's unwritten.
    rng = np.random.default_rng(5)
    feeds = _decode_feeds(rng, [3, 4], _caches(rng))
    with pytest.raises(ValueError, match="output output: the array to write it into must be a C-contiguous"):
        _attention_session().run(feeds, into={"output": REFUSED_OUTPUT_ARRAYS[kind]((B, 1, H * D))})


def test_a_graph_input_left_unfed_is_named_before_the_run():
    # ONNX Runtime would hand the op "no tensor" for it (an optional input too), failing inside the op.
    rng = np.random.default_rng(5)
    feeds = _decode_feeds(rng, [3, 4], _caches(rng))
    del feeds["past_lens"]
    with pytest.raises(ValueError, match="graph inputs not fed: past_lens"):
        _attention_session().bind(feeds)


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_failed_step_leaves_bound_caches_untouched(cache):
    rng = np.random.default_rng(2)
    caches = _caches(rng, cache)
    snapshot = {name: array.copy() for name, array in caches.items()}
    step = _attention_session(cache)
    feeds = _decode_feeds(rng, [C, 5], {name: ort.OrtValue.ortvalue_from_numpy(array)
                                        for name, array in caches.items()})  # row 0 is full
    with pytest.raises(Exception, match="capacity"):
        step.run(feeds)
    for name, array in caches.items():
        assert_equal(array, snapshot[name], name)
    feeds["past_lens"] = np.array([C - 1, 5], np.int32)  # the session still works afterwards
    step.run(feeds)
    assert not np.array_equal(caches["key_cache"], snapshot["key_cache"])


def test_metadata_updates_in_place():
    rng = np.random.default_rng(3)
    M = C // P
    block_max = rng.standard_normal((B, N, M, D)).astype(np.float32)
    block_min = block_max - 1.0
    x = dict(key=np.zeros((B, N, 1, D), np.float32), block_max=block_max, block_min=block_min,
             past_lens=np.zeros(B, np.int32))
    step = InPlaceStep(make_session(op_model("QuestMetadata", x, dict(block_size=P))),
                       {"block_max_out": "block_max", "block_min_out": "block_min"})
    key = rng.standard_normal((B, N, 1, D)).astype(np.float32)
    past = np.array([33, 64], np.int32)
    expected = quest_metadata(key, block_max, block_min, past, block_size=P)
    copied_before = native_copied_bytes()
    step.run(dict(key=key, block_max=ort.OrtValue.ortvalue_from_numpy(block_max),
                  block_min=ort.OrtValue.ortvalue_from_numpy(block_min), past_lens=past))
    assert native_copied_bytes() == copied_before
    np.testing.assert_array_equal(block_max, expected[0])
    np.testing.assert_array_equal(block_min, expected[1])


def test_int8_bounds_update_in_place():
    """int8 codes and their exponents bound to their own buffers: the step writes the touched blocks
    (its keys' blocks requantized) and copies nothing."""
    rng = np.random.default_rng(4)
    M = C // P
    keys = rng.standard_normal((B, N, 40, D)).astype(np.float32)
    zeros = np.zeros((B, N, M, D), np.int8)
    block_max, block_min, exponent = quest_metadata(keys, zeros, zeros.copy(), np.zeros(B, np.int32),
                                                    np.array([33, 40], np.int32), np.zeros((B, N, M), np.int8),
                                                    block_size=P)
    x = dict(key=np.zeros((B, N, 1, D), np.float32), block_max=block_max, block_min=block_min,
             past_lens=np.zeros(B, np.int32), block_exponent=exponent)
    aliases = {"block_max_out": "block_max", "block_min_out": "block_min", "block_exponent_out": "block_exponent"}
    step = InPlaceStep(make_session(op_model("QuestMetadata", x, dict(block_size=P))), aliases)
    key = 4 * rng.standard_normal((B, N, 1, D)).astype(np.float32)  # wider keys: the exponents grow
    past = np.array([33, 40], np.int32)
    expected = quest_metadata(key, block_max, block_min, past, None, exponent, block_size=P)
    copied_before = native_copied_bytes()
    bound = {name: ort.OrtValue.ortvalue_from_numpy(x[name]) for name in aliases.values()}
    step.run(dict(key=key, past_lens=past, **bound))
    assert native_copied_bytes() == copied_before
    for array, want, name in zip((block_max, block_min, exponent), expected, aliases.values()):
        assert_equal(array, want, name)


# Outputs bound to memory that overlaps an input or another output (other than an output bound to
# exactly its own input's buffer, in place) are refused before anything is written. Every buffer
# is a view into one float32 arena, bound by pointer, so the overlaps are exact and the whole arena
# can be checked afterwards. These run under `make test-sanitize` too: a partial overlap used to
# reach memcpy (ASan: memcpy-param-overlap), a crosswise binding silently corrupted the caches.

M = C // P
CACHE, BOUNDS = (B, N, C, D), (B, N, M, D)
CACHE_SIZE, BOUNDS_SIZE = int(np.prod(CACHE)), int(np.prod(BOUNDS))


def _bound_run(session, inputs, outputs):
    """Run with every input and the given outputs bound by pointer (other outputs: fresh memory)."""
    binding = session.io_binding()
    for name, array in inputs.items():
        binding.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
    for output in session.get_outputs():
        if output.name in outputs:
            array = outputs[output.name]
            binding.bind_output(output.name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        else:
            binding.bind_output(output.name, "cpu")
    session.run_with_iobinding(binding)


def _carve(arena, offset, shape):
    """The float32 view of `arena` at element `offset` with `shape`."""
    return arena[offset:offset + int(np.prod(shape))].reshape(shape)


# Each op's float32 inputs at arena offsets with gaps between them, so that a case's outputs
# overlap exactly the inputs it names; the arena's last part is memory no input uses.
ATTENTION_LAYOUT = dict(key_cache=0, value_cache=2 * CACHE_SIZE, query=4 * CACHE_SIZE, key=5 * CACHE_SIZE,
                        value=6 * CACHE_SIZE)
METADATA_LAYOUT = dict(block_max=0, block_min=2 * BOUNDS_SIZE, key=4 * BOUNDS_SIZE)
FREE_CACHE, FREE_BOUNDS = 6 * CACHE_SIZE + CACHE_SIZE // 2, 6 * BOUNDS_SIZE


def _attention_case(bound, layout=ATTENTION_LAYOUT):
    """A SparseBlockAttention decode step: the session, its inputs, the outputs `bound` (name ->
    (offset, shape)) and the arena that holds them all."""
    arena = np.random.default_rng(6).standard_normal(8 * CACHE_SIZE).astype(np.float32)
    shapes = dict(query=(B, H, 1, D), key=(B, N, 1, D), value=(B, N, 1, D), key_cache=CACHE, value_cache=CACHE)
    inputs = {name: _carve(arena, layout[name], shape) for name, shape in shapes.items()}
    inputs["past_lens"] = np.array([3, 4], np.int32)
    outputs = {name: _carve(arena, offset, shape) for name, (offset, shape) in bound.items()}
    return _attention_session().session, inputs, outputs, arena


def _metadata_case(bound):
    """A QuestMetadata step, as _attention_case."""
    arena = np.random.default_rng(7).standard_normal(8 * BOUNDS_SIZE).astype(np.float32)
    shapes = dict(key=(B, N, 1, D), block_max=BOUNDS, block_min=BOUNDS)
    inputs = {name: _carve(arena, METADATA_LAYOUT[name], shape) for name, shape in shapes.items()}
    inputs["past_lens"] = np.array([33, 64], np.int32)
    session = make_session(op_model("QuestMetadata", inputs, dict(block_size=P)))
    outputs = {name: _carve(arena, offset, shape) for name, (offset, shape) in bound.items()}
    return session, inputs, outputs, arena


OVERLAPS = {
    # (a) an output partly over its own input: the in-place copy would overlap itself.
    "attention: key_cache_out half over key_cache": (
        _attention_case, dict(key_cache_out=(CACHE_SIZE // 2, CACHE)),
        r"SparseBlockAttention: output 'key_cache_out' partly overlaps its input 'key_cache'"),
    "metadata: block_min_out one element past block_min": (
        _metadata_case, dict(block_min_out=(2 * BOUNDS_SIZE + 1, BOUNDS)),
        r"QuestMetadata: output 'block_min_out' partly overlaps its input 'block_min'"),
    # (b) an output over another input: caches bound crosswise, the attention output over the query.
    "attention: caches crosswise": (
        _attention_case, dict(key_cache_out=(2 * CACHE_SIZE, CACHE), value_cache_out=(0, CACHE)),
        r"SparseBlockAttention: output 'key_cache_out' overlaps input 'value_cache'"),
    "attention: value_cache_out on key_cache": (
        _attention_case, dict(value_cache_out=(0, CACHE)),
        r"SparseBlockAttention: output 'value_cache_out' overlaps input 'key_cache'"),
    "attention: output on query": (
        _attention_case, dict(output=(4 * CACHE_SIZE, (B, 1, H * D))),
        r"SparseBlockAttention: output 'output' overlaps input 'query'"),
    "metadata: bounds crosswise": (
        _metadata_case, dict(block_max_out=(2 * BOUNDS_SIZE, BOUNDS), block_min_out=(0, BOUNDS)),
        r"QuestMetadata: output 'block_max_out' overlaps input 'block_min'"),
    "metadata: block_max_out over the key's start": (
        _metadata_case, dict(block_max_out=(4 * BOUNDS_SIZE - 10, BOUNDS)),
        r"QuestMetadata: output 'block_max_out' overlaps input 'key'"),
    # (c) two outputs over each other (neither over an input).
    "attention: both caches on one buffer": (
        _attention_case, dict(key_cache_out=(FREE_CACHE, CACHE), value_cache_out=(FREE_CACHE, CACHE)),
        r"SparseBlockAttention: outputs 'key_cache_out' and 'value_cache_out' overlap"),
    "metadata: bounds 7 elements apart": (
        _metadata_case, dict(block_max_out=(FREE_BOUNDS, BOUNDS), block_min_out=(FREE_BOUNDS - 7, BOUNDS)),
        r"QuestMetadata: outputs 'block_max_out' and 'block_min_out' overlap"),
}


@pytest.mark.parametrize("case", list(OVERLAPS))
def test_overlapping_bindings_are_refused_before_anything_is_written(case):
    build, bound, message = OVERLAPS[case]
    session, inputs, outputs, arena = build(bound)
    before = arena.copy()
    with pytest.raises(Exception, match=message):
        _bound_run(session, inputs, outputs)
    np.testing.assert_array_equal(arena, before)  # inputs and bound outputs: not a byte written


# With int8 caches the scales are in-place outputs too, refused alike. One byte arena holds the int8
# caches, their float16 scales and the float32 activations, at these byte offsets.
SCALES, SCALE_BYTES = (B, N, C), B * N * C * 2
INT8_LAYOUT = dict(key_cache=0, value_cache=2 * CACHE_SIZE, key_scale=4 * CACHE_SIZE,
                   value_scale=4 * CACHE_SIZE + 2 * SCALE_BYTES, query=4 * CACHE_SIZE + 4 * SCALE_BYTES)
INT8_LAYOUT.update(key=INT8_LAYOUT["query"] + B * H * D * 4, value=INT8_LAYOUT["query"] + 2 * B * H * D * 4)
FREE_BYTES = INT8_LAYOUT["query"] + 3 * B * H * D * 4
INT8_SHAPES = dict(key_cache=(CACHE, np.int8), value_cache=(CACHE, np.int8), key_scale=(SCALES, np.float16),
                   value_scale=(SCALES, np.float16), query=((B, H, 1, D), np.float32),
                   key=((B, N, 1, D), np.float32), value=((B, N, 1, D), np.float32))


def _carve_bytes(arena, offset, shape, dtype):
    return arena[offset:offset + int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


SCALE_OVERLAPS = {
    "key_scale_out on value_scale": (dict(key_scale_out=INT8_LAYOUT["value_scale"]),
                                     r"SparseBlockAttention: output 'key_scale_out' overlaps input 'value_scale'"),
    "key_scale_out one element past key_scale": (
        dict(key_scale_out=INT8_LAYOUT["key_scale"] + 2),
        r"SparseBlockAttention: output 'key_scale_out' partly overlaps its input 'key_scale'"),
    "value_scale_out over the value cache": (
        dict(value_scale_out=INT8_LAYOUT["value_cache"] + 64),
        r"SparseBlockAttention: output 'value_scale_out' overlaps input 'value_cache'"),
    "both scales on one buffer": (dict(key_scale_out=FREE_BYTES, value_scale_out=FREE_BYTES),
                                  r"SparseBlockAttention: outputs 'key_scale_out' and 'value_scale_out' overlap"),
}


@pytest.mark.parametrize("case", list(SCALE_OVERLAPS))
def test_overlapping_scale_bindings_are_refused_before_anything_is_written(case):
    bound, message = SCALE_OVERLAPS[case]
    arena = np.random.default_rng(9).integers(0, 256, FREE_BYTES + 2 * SCALE_BYTES, dtype=np.uint8)
    inputs = {name: _carve_bytes(arena, INT8_LAYOUT[name], *INT8_SHAPES[name]) for name in INT8_LAYOUT}
    inputs["past_lens"] = np.array([3, 4], np.int32)
    outputs = {name: _carve_bytes(arena, offset, SCALES, np.float16) for name, offset in bound.items()}
    before = arena.copy()
    with pytest.raises(Exception, match=message):
        _bound_run(_attention_session("int8").session, inputs, outputs)
    np.testing.assert_array_equal(arena, before)


# With int8 bounds the exponents are an in-place output too: one byte arena holds the int8 codes,
# the exponents and the float32 key, at these byte offsets.
EXPONENTS, EXPONENT_BYTES = (B, N, M), B * N * M
BOUNDS_BYTES = BOUNDS_SIZE  # int8 codes
INT8_BOUNDS_LAYOUT = dict(block_max=0, block_min=2 * BOUNDS_BYTES, block_exponent=4 * BOUNDS_BYTES,
                          key=4 * BOUNDS_BYTES + 2 * EXPONENT_BYTES)
FREE_EXPONENT_BYTES = INT8_BOUNDS_LAYOUT["key"] + B * N * D * 4
INT8_BOUNDS_SHAPES = dict(block_max=(BOUNDS, np.int8), block_min=(BOUNDS, np.int8),
                          block_exponent=(EXPONENTS, np.int8), key=((B, N, 1, D), np.float32))

EXPONENT_OVERLAPS = {
    "block_exponent_out one element past block_exponent": (
        dict(block_exponent_out=INT8_BOUNDS_LAYOUT["block_exponent"] + 1),
        r"QuestMetadata: output 'block_exponent_out' partly overlaps its input 'block_exponent'"),
    "block_exponent_out over block_min": (
        dict(block_exponent_out=INT8_BOUNDS_LAYOUT["block_min"] + 8),
        r"QuestMetadata: output 'block_exponent_out' overlaps input 'block_min'"),
    "block_exponent_out over the key": (
        dict(block_exponent_out=INT8_BOUNDS_LAYOUT["key"]),
        r"QuestMetadata: output 'block_exponent_out' overlaps input 'key'"),
}


@pytest.mark.parametrize("case", list(EXPONENT_OVERLAPS))
def test_overlapping_exponent_bindings_are_refused_before_anything_is_written(case):
    bound, message = EXPONENT_OVERLAPS[case]
    arena = np.random.default_rng(10).integers(0, 256, FREE_EXPONENT_BYTES + 2 * EXPONENT_BYTES, dtype=np.uint8)
    inputs = {name: _carve_bytes(arena, INT8_BOUNDS_LAYOUT[name], *INT8_BOUNDS_SHAPES[name])
              for name in INT8_BOUNDS_LAYOUT}
    inputs["key"][...] = 1.0  # (the arena's random bytes as floats could be anything)
    inputs["past_lens"] = np.array([33, 64], np.int32)
    outputs = {name: _carve_bytes(arena, offset, EXPONENTS, np.int8) for name, offset in bound.items()}
    session = make_session(op_model("QuestMetadata", inputs, dict(block_size=P),
                                    outputs=("block_max_out", "block_min_out", "block_exponent_out")))
    before = arena.copy()
    with pytest.raises(Exception, match=message):
        _bound_run(session, inputs, outputs)
    np.testing.assert_array_equal(arena, before)


def test_select_output_over_an_input_is_refused():
    arena = np.random.default_rng(8).standard_normal(4 * BOUNDS_SIZE).astype(np.float32)
    x = dict(query=_carve(arena, 3 * BOUNDS_SIZE, (B, H, 1, D)), block_max=_carve(arena, 0, BOUNDS),
             block_min=_carve(arena, BOUNDS_SIZE, BOUNDS), past_lens=np.array([33, 64], np.int32))
    session = make_session(op_model("SparseBlockSelect", x, dict(num_heads=H, kv_num_heads=N, block_size=P, top_k=4)))
    indices = arena[3 * BOUNDS_SIZE + 5:].view(np.int32)[:B * N * 4].reshape(B, N, 1, 4)
    before = arena.copy()
    with pytest.raises(Exception, match=r"SparseBlockSelect: output 'block_indices' overlaps input 'query'"):
        _bound_run(session, x, {"block_indices": indices})
    np.testing.assert_array_equal(arena, before)


def test_adjacent_and_in_place_bindings_still_run():
    """Outputs that end exactly where an input starts, and a cache bound in place, run: the check
    is on byte ranges, not on nearness."""
    layout = dict(ATTENTION_LAYOUT, key_cache=CACHE_SIZE)
    session, inputs, outputs, _ = _attention_case(
        dict(key_cache_out=(0, CACHE), value_cache_out=(2 * CACHE_SIZE, CACHE),
             output=(4 * CACHE_SIZE - B * H * D, (B, 1, H * D))), layout)
    expected = sparse_block_attention(inputs["query"], inputs["key"], inputs["value"], inputs["key_cache"].copy(),
                                      inputs["value_cache"].copy(), inputs["past_lens"], **ATTENTION)
    _bound_run(session, inputs, outputs)
    np.testing.assert_array_equal(outputs["key_cache_out"], expected[1])
    np.testing.assert_array_equal(outputs["value_cache_out"], expected[2])
    assert_close(outputs["output"], expected[0], np.float32, "output")
