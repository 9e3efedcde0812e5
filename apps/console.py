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

from ..pipeline.progress import LOGGER, bar  # noqa: F401 (the commands' bars: re-exported)


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
