"""What the commands show on the terminal: logging set up by -v / --quiet, and progress bars on long work.

Messages go through `logging` (the "quest_ort" logger, on stderr, so stdout carries only results);
bars are tqdm's, on stderr, shown only on a terminal, and the log lines are written above them.
Third-party chatter (transformers' and huggingface_hub's own bars and warnings) is turned down so it
does not interleave with ours.
"""

from __future__ import annotations

import logging
import os
import sys
import time

LOGGER = "quest_ort"


class _AboveBars(logging.StreamHandler):
    """Writes each record through tqdm.write: an open bar is redrawn below it, not broken."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise; StreamHandler's own fallback
            self.handleError(record)


def configure_logging(verbose: bool = False, quiet: bool = False) -> None:
    """INFO by default, DEBUG with -v, warnings only with --quiet."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = _AboveBars(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger(LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    for name in ("transformers", "huggingface_hub", "optimum"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # transformers' and the hub's own bars (GGUF conversion, checkpoint loading) and advice, read when
    # they are imported (not imported here: a command that needs neither must not pay for them).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if sys.modules.get("transformers") is not None:  # already imported: tell it directly
        try:
            from transformers.utils import logging as transformers_logging
        except ImportError:  # a broken or stubbed transformers: the exporter names it later
            return
        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()


def add_logging_flags(parser) -> None:
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("-v", "--verbose", action="store_true", help="debug messages")
    noise.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")


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
