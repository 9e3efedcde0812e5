"""Progress of long work on the terminal: tqdm bars on stderr (only where someone sees them) and numbered steps logged as they finish."""

from __future__ import annotations

import logging
import sys
import time

LOGGER = "quest_ort"  # the package's logger (apps/console.py sets up its handler)


def bar(total: int, unit: str, description: str):
    """A tqdm bar on stderr, or None when nobody would see it (not a terminal, or --quiet)."""
    if not sys.stderr.isatty() or not logging.getLogger(LOGGER).isEnabledFor(logging.INFO):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=description, leave=False, file=sys.stderr, dynamic_ncols=True)


class Progress:
    """Numbered steps of a long job: a bar naming the running step (on a terminal), and one line
    per finished step with its duration, through `log` (a callable taking the line; None: the
    package's logger at INFO)."""

    def __init__(self, total: int, log=None):
        self.total, self.index, self.started, self.message = total, 0, None, ""
        self.log = log if log is not None else logging.getLogger(LOGGER).info
        self.bar = bar(total, "step", "") if log is None else None

    def step(self, message: str) -> None:
        self.done()
        self.index += 1
        self.message = f"[{self.index}/{self.total}] {message}"
        self.started = time.perf_counter()
        if self.bar is not None:
            self.bar.set_description(self.message)

    def done(self) -> None:
        if self.started is None:
            return
        self.log(f"{self.message} ... {time.perf_counter() - self.started:.1f}s")
        self.started = None
        if self.bar is not None:
            self.bar.update(1)
            if self.index == self.total:
                self.bar.close()
                self.bar = None
