"""Checks of the arguments callers hand the runtime (token ids, prompts, counts, sampling numbers): a bad
one is a ValueError naming it, raised before anything runs or any cache is touched.

NumPy would otherwise convert quietly: float token ids truncate (3.9 becomes 3), booleans become 0
and 1, a string prompt fails halfway through filling a batch, a NaN temperature samples garbage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class InputTypeError(TypeError, ValueError):
    """An argument of the wrong kind (a float or a string where token ids belong). A ValueError too,
    so that `except ValueError` catches every refused argument."""


def integer(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int: a Python or NumPy integer (not a bool, not a float, even a whole one)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputTypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    low, high = minimum is not None and value < minimum, maximum is not None and value > maximum
    if low or high:
        bounds = [f">= {minimum}"] * (minimum is not None) + [f"<= {maximum}"] * (maximum is not None)
        raise ValueError(f"{name} must be {' and '.join(bounds)}, got {value}")
    return int(value)


def number(value, name: str, *, minimum: float, maximum: float = math.inf, above_minimum: bool = False) -> float:
    """`value` as a finite float in [minimum, maximum] ((minimum, maximum] with `above_minimum`)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    low_ok = value > minimum if above_minimum else value >= minimum
    if not (math.isfinite(value) and low_ok and value <= maximum):  # NaN fails every comparison
        bounds = f"{'(' if above_minimum else '['}{minimum:g}, {maximum:g}]" if math.isfinite(maximum) else \
            f">= {minimum:g}"
        raise ValueError(f"{name} must be finite and {'in ' if math.isfinite(maximum) else ''}{bounds}, got {value}")
    return value


def token_ids(value, name: str, vocab: int | None, ndim: int) -> np.ndarray:
    """`value` (an integer array, or nested lists of ints) as int64 token ids of `ndim` dims, each in
    [0, vocab) (vocab None: unknown, only >= 0)."""
    if isinstance(value, (str, bytes)):
        raise InputTypeError(f"{name} must hold integer token ids, got a {type(value).__name__} {value!r:.40}")
    try:
        array = np.asarray(value)
    except ValueError:  # NumPy refuses ragged nesting
        raise InputTypeError(f"{name} must be a rectangular array of token ids (rows of one length)") from None
    if array.size == 0 and array.dtype.kind == "f":
        array = array.astype(np.int64)  # an empty list is float64 to NumPy: say what is wrong with it instead
    if array.dtype.kind not in "iu":
        example = f" such as {array.flat[0]!r}" if array.size else ""
        raise InputTypeError(f"{name} must hold integer token ids, got {array.dtype} values{example}")
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dim{'s' if ndim > 1 else ''}, got shape {array.shape}")
    # The range is checked in the given dtype: a uint64 past int64 must not wrap into a valid id.
    if array.size and (array.min() < 0 or (vocab is not None and array.max() >= vocab)):
        allowed = f"[0, {vocab})" if vocab is not None else ">= 0"
        raise ValueError(f"{name} must lie in {allowed}, got values from {array.min()} to {array.max()}")
    return array.astype(np.int64)


def prompts(value, vocab: int | None) -> list[np.ndarray]:
    """A batch of prompts: a non-empty sequence of non-empty token id sequences, as int64 arrays."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise InputTypeError(f"prompts must be a list of prompts, each a list of token ids, got "
                             f"{type(value).__name__} {value!r:.40}")
    if len(value) == 0:
        raise ValueError("prompts is empty: give at least one prompt")
    rows = []
    for index, prompt in enumerate(value):
        name = f"prompts[{index}]"
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)):
            hint = " (one prompt is [[id, id, ...]])" if isinstance(prompt, (int, np.integer)) else ""
            raise InputTypeError(f"{name} must be a list of token ids, got {type(prompt).__name__} {prompt!r:.40}{hint}")
        row = token_ids(prompt, name, vocab, ndim=1)
        if row.size == 0:
            raise ValueError(f"{name} is empty: every prompt needs at least one token")
        rows.append(row)
    return rows


def step_arguments(input_ids, valid, exact, batch: int, vocab: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A model step's input_ids [batch, S >= 1] and valid counts per row (default S), checked."""
    ids = token_ids(input_ids, "input_ids", vocab, ndim=2)
    if ids.shape[0] != batch:
        raise ValueError(f"input_ids must be [batch={batch}, S], got shape {ids.shape}")
    positions = ids.shape[1]
    if positions == 0:
        raise ValueError("input_ids has no position (S = 0): a step takes at least one token per row "
                         "(valid = 0 masks a row)")
    if valid is None:
        valid = np.full(batch, positions, np.int32)
    else:
        valid = np.asarray(valid)
        if valid.dtype.kind not in "iu" or valid.shape != (batch,) or (valid < 0).any() or (valid > positions).any():
            raise ValueError(f"valid must hold {batch} integer counts in [0, {positions}], got {valid.dtype} "
                             f"{valid.tolist()}")
        valid = valid.astype(np.int32)
    if not isinstance(exact, (bool, np.bool_)):
        raise InputTypeError(f"exact must be True or False, got {type(exact).__name__} {exact!r}")
    return ids, valid
