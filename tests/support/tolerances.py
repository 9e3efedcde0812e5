"""The one table of numeric tolerances, keyed by the dtype compared, and mask-printing asserts."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


# Kernels accumulate in float32 against a float64 reference; float16 results add one rounding.
# int8: a model's logits over int8 KV caches against float ones (every key and value rounded to
# 1/254 of its row's largest magnitude; the tiny export models differ by 2e-3 at most).
TOLERANCES = {
    np.dtype(np.float32): Tolerance(rtol=1e-4, atol=2e-5),
    np.dtype(np.float16): Tolerance(rtol=4e-3, atol=2e-3),
    np.dtype(np.int8): Tolerance(rtol=1e-2, atol=1e-2),
}


def _mask(bad: np.ndarray, axes: str) -> str:
    """Rows of '.'/'x' over the last axis of `bad` (leading axes flattened), at most 24 rows."""
    grid = bad.reshape(-1, bad.shape[-1]) if bad.ndim > 1 else bad.reshape(1, -1)
    lines = [f"mismatch mask over {axes} (rows: leading axes flattened; x = mismatch)"]
    for r, row in enumerate(grid[:24]):
        lines.append(f"{r:4d} " + "".join("x" if v else "." for v in row[:120]))
    if grid.shape[0] > 24:
        lines.append(f"     ... {grid.shape[0] - 24} more rows")
    return "\n".join(lines)


def assert_close(actual, expected, dtype, name: str, axes: str = "last axis") -> None:
    """Compare within TOLERANCES[dtype]; on failure report counts, worst error and a mask."""
    tol = TOLERANCES[np.dtype(dtype)]
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    close = np.isclose(actual, expected, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
    if close.all():
        return
    bad = ~close
    worst = np.unravel_index(np.argmax(np.where(bad, np.abs(actual - expected), -1)), bad.shape)
    reduced = bad.any(axis=-1) if bad.ndim > 1 else bad
    raise AssertionError(
        f"{name}: {bad.sum()} of {bad.size} values outside rtol={tol.rtol} atol={tol.atol}; "
        f"worst at {tuple(int(i) for i in worst)}: {actual[worst]!r} vs {expected[worst]!r}\n{_mask(reduced, axes)}"
    )


def assert_equal(actual, expected, name: str, axes: str = "last axis") -> None:
    """Bitwise-equal comparison (NaN equal to NaN); on failure print a mask."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind == "f":
        width = actual.dtype.itemsize  # explicit, so that empty arrays reshape too
        same = (actual.view(np.uint8).reshape(*actual.shape, width)
                == expected.view(np.uint8).reshape(*expected.shape, width)).all(-1)
    else:
        same = actual == expected
    if same.all():
        return
    bad = ~same
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise AssertionError(
        f"{name}: {bad.sum()} of {bad.size} values differ; first at {first}: {actual[first]!r} vs {expected[first]!r}\n"
        f"{_mask(bad, axes)}"
    )


def assert_used_blocks_equal(actual, expected, total_lens, block_size: int, name: str) -> None:
    """Bitwise comparison of metadata [B, N, M, D] on the blocks that hold a valid token (row b
    holds total_lens[b]); the other blocks are unspecified."""
    used = np.arange(np.shape(actual)[2])[None, :] * block_size < np.asarray(total_lens)[:, None]  # [B, M]
    assert_equal(np.moveaxis(actual, 2, 1)[used], np.moveaxis(expected, 2, 1)[used], name,
                 axes="(used block, n) x D")
