"""Fuzz target (atheris) for the ORT adapter's validation: arbitrary op calls must run or be refused.

Each input picks an op, which optional inputs are present, every input's rank, dims and element
type, the attribute values (in and out of range) and the lengths and indices, then runs the op in
ONNX Runtime with the native library. An error from ONNX Runtime is a pass; a crash, a hang or any
other exception is a finding. Shapes stay small (the fuzzer hunts for validation gaps, not memory).

    python tests/ops/fuzz/fuzz_ops.py -runs=20000                    # what `make fuzz` runs in CI
    python tests/ops/fuzz/fuzz_ops.py -max_total_time=3600 corpus/   # a longer run, keeping a corpus

Python-level coverage guides the search (the native library is not instrumented; the ASan build of
`make test-sanitize` is what catches memory errors, and `make fuzz` fuzzes against it too).
"""

from __future__ import annotations

import ctypes
import sys

import atheris

with atheris.instrument_imports():
    import numpy as np
    import onnxruntime as ort

    from quest_ort.ops import get_library_path
    from quest_ort.ops.schemas import OPS_BY_NAME
    from quest_ort.runtime.sessions import QuestModelError
    from quest_ort.runtime.single_op import run_op

OPS = sorted(OPS_BY_NAME)
FLOATS = (np.float32, np.float16)
FOREIGN = (np.float64, np.int64, np.int8, np.bool_)
# Ints that find off-by-ones and overflows in length arithmetic, and ordinary small values.
EDGE_INTS = (0, 1, -1, 2, 3, 7, 16, 17, 31, 32, 33, 127, 128, 2**15, 2**31 - 1, -(2**31), 2**31 - 17)
MAX_ELEMENTS = 1 << 16
ORT_ERRORS = tuple(getattr(ort.capi.onnxruntime_pybind11_state, name) for name in (
    "Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "RuntimeException", "NotImplemented"))
# The session factory's diagnosis of a model ONNX Runtime refused (it names the node and input).
REFUSED = (*ORT_ERRORS, QuestModelError)


def _int(fdp: atheris.FuzzedDataProvider, small: int = 8) -> int:
    """Mostly a small plausible value (1..small), sometimes an edge value."""
    if fdp.ConsumeProbability() < 0.8:
        return fdp.ConsumeIntInRange(1, small)
    return EDGE_INTS[fdp.ConsumeIntInRange(0, len(EDGE_INTS) - 1)]


def _attribute(fdp, attribute):
    """A value for `attribute`, or None to leave it out (rarely, when it is required)."""
    # (An exhausted provider returns zeros: the common case is the one zero selects.)
    if attribute.required and fdp.ConsumeProbability() > 0.97 or not attribute.required and fdp.ConsumeBool():
        return None
    if attribute.kind == "string":
        choices = list(attribute.choices) * 4 + ["", "MEAN", "probe ", "\x00"]
        return choices[fdp.ConsumeIntInRange(0, len(choices) - 1)]
    if attribute.kind == "float":
        if fdp.ConsumeProbability() < 0.7:
            return fdp.ConsumeProbability()
        return float(fdp.PickValueInList([0.0, -0.0, 1.0, 1.5, -1.0, float("nan"), float("inf"), 1e-30, 1e30]))
    value = _int(fdp) if fdp.ConsumeProbability() < 0.9 else fdp.ConsumeIntInRange(-(2**40), 2**40)
    if attribute.name in ("top_k", "chunk_top_k"):
        value = min(value, 4096)  # it sizes an output: the contract allows any, memory does not
    return value


def _plausible_ints(fdp, name: str, shape, dims: dict, earlier: dict) -> np.ndarray:
    """Lengths inside the capacity and distinct in-range block indices, so that fuzzed calls also
    get past the value checks and into the kernels."""
    new_tokens = dims.get("S", 1)
    blocks = dims.get("M") or -(-dims.get("C", 1) // max(dims.get("P", 1), 1))
    limit = min(dims.get("C", 2**31 - 1), blocks * dims.get("P", 1))
    if name in ("block_indices", "chunk_indices"):
        if 0 in shape:  # empty, however long its other dims (an arange of 2^31 would not be)
            return np.zeros(shape, np.int64)
        row = np.arange(shape[-1] if shape else 1, dtype=np.int64) + fdp.ConsumeIntInRange(-1, 1)
        row[(row < 0) | (row >= blocks)] = -1
        return np.broadcast_to(row, shape).copy() if shape else row[:1].reshape(())
    size = int(np.prod(shape))
    if name == "total_lens" and "past_lens" in earlier and earlier["past_lens"].shape == tuple(shape):
        return earlier["past_lens"].astype(np.int64) + np.array([fdp.ConsumeIntInRange(0, new_tokens) for _ in range(size)],
                                                                 np.int64).reshape(shape)
    if name in ("exact_lens", "chunk_lens") and "past_lens" in earlier and earlier["past_lens"].shape == tuple(shape):
        # from before the call to its end: all, some or none of its queries attend exactly (or per chunk)
        return earlier["past_lens"].astype(np.int64) + np.array(
            [fdp.ConsumeIntInRange(-1, new_tokens) for _ in range(size)], np.int64).reshape(shape)
    values = [fdp.ConsumeIntInRange(0, max(0, limit - new_tokens)) for _ in range(min(size, 64))]
    return np.resize(np.array(values or [0], dtype=np.int64), shape)


def _tensor(fdp, tensor, dims: dict, type_vars: dict, earlier: dict, cache_types=FLOATS):
    """An array for `tensor`, usually agreeing with earlier dims and types, sometimes not.
    `cache_types`: what the op's TC may be (int8 too: SparseBlockAttention's caches, the other ops' bounds)."""
    rank = len(tensor.dims) if fdp.ConsumeProbability() < 0.9 else fdp.ConsumeIntInRange(0, 5)
    shape = []
    for axis in range(rank):
        symbol = tensor.dims[axis] if axis < len(tensor.dims) else f"extra{axis}"
        if symbol not in dims or fdp.ConsumeProbability() < 0.03:
            dims.setdefault(symbol, abs(_int(fdp, 6)) if symbol != "C" else abs(_int(fdp, 64)))
            shape.append(dims[symbol] if fdp.ConsumeProbability() < 0.97 else fdp.ConsumeIntInRange(0, 40))
        else:
            shape.append(dims[symbol])
    shape = [min(d, 2**31 - 1) for d in shape]  # abs(-2**31) does not fit an ONNX dim either
    # Huge dims are welcome next to a zero dim (empty tensors), but numpy caps the product of the rest.
    if np.prod(shape, dtype=np.float64) > MAX_ELEMENTS or np.prod([max(d, 1) for d in shape], dtype=np.float64) > 2**40:
        shape = [min(d, 8) for d in shape]
    if tensor.elem == "int32":
        dtype = np.int32 if fdp.ConsumeProbability() < 0.95 else FOREIGN[fdp.ConsumeIntInRange(0, 3)]
        if fdp.ConsumeProbability() < 0.8:
            return _plausible_ints(fdp, tensor.name, shape, dims, earlier).astype(dtype)
        values = [_int(fdp, 40) * (1 if fdp.ConsumeBool() else -1) for _ in range(min(int(np.prod(shape)), 64))]
        array = np.resize(np.array(values or [0], dtype=np.int64), shape)
        return array.astype(dtype)
    if tensor.elem in ("float32", "float16"):  # fixed types (float16: an int8 cache's scales)
        own = np.dtype(tensor.elem).type
        dtype = own if fdp.ConsumeProbability() < 0.95 else FLOATS[1 - FLOATS.index(own)]
    elif tensor.elem == "int8":  # int8 bounds' exponents: any int8 is defined, 127 (non-finite) included
        dtype = np.int8 if fdp.ConsumeProbability() < 0.95 else FOREIGN[fdp.ConsumeIntInRange(0, 3)]
    else:
        if tensor.elem not in type_vars or fdp.ConsumeProbability() < 0.05:
            types = cache_types if tensor.elem == "TC" else FLOATS
            type_vars.setdefault(tensor.elem, types[fdp.ConsumeIntInRange(0, len(types) - 1)])
        dtype = type_vars[tensor.elem] if fdp.ConsumeProbability() < 0.95 else FOREIGN[fdp.ConsumeIntInRange(0, 3)]
    rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 1000))
    if np.dtype(dtype) == np.int8:  # an int8 cache's values, int8 bounds' codes and exponents: any of them
        return rng.integers(-128, 128, shape, dtype=np.int8)
    values = rng.standard_normal(shape).astype(np.float32)
    if fdp.ConsumeProbability() > 0.9:
        values[...] = fdp.PickValueInList([0.0, float("nan"), float("inf"), -float("inf"), 65504.0])
    return values.astype(dtype)


# An int8 cache's scales and int8 bounds' exponents, inputs and outputs: given mostly with int8
# caches or bounds (so that calls reach the int8 kernels; left out, the refusal) and seldom with
# float ones (the refusal).
INT8_ONLY = {"key_scale", "value_scale", "key_scale_out", "value_scale_out", "block_exponent", "block_exponent_out"}


def _given(fdp, name: str, type_vars: dict) -> bool:
    """Whether an optional input or output is given."""
    if name in INT8_ONLY:
        return fdp.ConsumeProbability() < (0.9 if type_vars.get("TC") is np.int8 else 0.1)
    return fdp.ConsumeBool()


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    spec = OPS_BY_NAME[OPS[fdp.ConsumeIntInRange(0, len(OPS) - 1)]]
    attributes = {}
    for attribute in spec.attributes:
        value = _attribute(fdp, attribute)
        if value is not None:
            attributes[attribute.name] = value
    dims = {symbol: attributes[name] for symbol, name in spec.symbol_attrs.items()
            if isinstance(attributes.get(name), int) and 0 <= attributes[name] <= 40}
    if "H" in dims and "N" in dims and fdp.ConsumeProbability() < 0.9:  # block_indices rows: per KV or query head
        dims["R"] = dims["H"] if fdp.ConsumeBool() else dims["N"]
    inputs, type_vars = {}, {}
    cache_types = tuple(np.dtype(name).type for name in spec.type_vars()["TC"])
    for tensor in spec.inputs:
        if tensor.optional and not _given(fdp, tensor.name, type_vars):
            continue
        # (np.resize to shape () gives a NumPy scalar, which ONNX Runtime does not take as a tensor)
        inputs[tensor.name] = np.asarray(_tensor(fdp, tensor, dims, type_vars, inputs, cache_types))
    outputs = tuple(t.name for t in spec.outputs if not t.optional or _given(fdp, t.name, type_vars))
    try:
        run_op(spec.name, inputs, attributes, outputs=outputs, symbolic_dims=False)
    except REFUSED:
        pass


def main() -> None:
    # Every session registers the library and ONNX Runtime unloads it with the session's options.
    # Held here, it stays loaded as in an app: under ASan each reload left ~0.5 MB of shadow pages
    # behind, past libFuzzer's 2 GB RSS limit within a few thousand runs.
    library = ctypes.CDLL(get_library_path())  # noqa: F841 (kept alive until the process ends)
    ort.set_default_logger_severity(4)  # rejections are the expected outcome; keep the log readable
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
