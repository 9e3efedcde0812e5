"""Inputs of the quality evaluation: natural text that a package ships, and pass-key prompts.

The text is the license collection Debian's essential `base-files` package installs in
/usr/share/common-licenses (GPL, LGPL, Apache, MPL, Artistic, ...): long-form English prose,
never one sentence repeated, and (unlike Python's documentation) free of talk about `pass`.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from quest_ort.apps.demo import PASS_KEY as INSTRUCTION
from quest_ort.apps.demo import QUESTION
from quest_ort.apps.demo import pass_key_sentence

LICENSES = pathlib.Path("/usr/share/common-licenses")
ORDER = ("GPL-3", "Apache-2.0", "LGPL-3", "MPL-2.0", "GPL-2", "Artistic", "LGPL-2.1", "GFDL-1.3", "CC0-1.0", "BSD")


@functools.cache
def natural_text() -> str:
    if not LICENSES.is_dir():
        raise FileNotFoundError(f"{LICENSES} is missing (Debian's base-files package installs it)")
    names = [n for n in ORDER if (LICENSES / n).is_file()]
    names += sorted(p.name for p in LICENSES.iterdir() if p.is_file() and not p.is_symlink() and p.name not in names)
    return "\n\n".join((LICENSES / name).read_text(errors="replace").strip() for name in names)


@functools.cache
def _text_ids(tokenizer) -> list[int]:
    """The whole natural text as `tokenizer`'s ids (tokenized once per tokenizer)."""
    return tokenizer(natural_text(), add_special_tokens=False).input_ids


def filler_ids(tokenizer, tokens: int, offset: int) -> list[int]:
    """`tokens` tokens of natural text, starting `offset` tokens into it."""
    ids = _text_ids(tokenizer)
    start = offset % max(1, len(ids) - tokens)
    return ids[start : start + tokens]


def pass_key_prompt(tokenizer, key: str, length: int, depth: float, seed: int) -> list[int]:
    """A chat prompt of about `length` tokens with the key sentence at `depth` (0..1) of the filler."""
    return tokenizer.apply_chat_template(pass_key_messages(tokenizer, key, length, depth, seed), add_generation_prompt=True)


def pass_key_messages(tokenizer, key: str, length: int, depth: float, seed: int) -> list[dict]:
    """pass_key_prompt's conversation: its one user message."""
    return needle_messages(tokenizer, INSTRUCTION, {depth: f" {pass_key_sentence(key)} "}, QUESTION, length, seed)


def needle_messages(tokenizer, instruction: str, needles: dict[float, str], question: str, length: int,
                    seed: int) -> list[dict]:
    """One user message of about `length` tokens: the instruction, natural text with each needle at
    its depth (0..1) of it, the question."""
    overhead = len(tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{instruction}\n\n{''.join(needles.values())}\n\n{question}"}],
        add_generation_prompt=True))
    filler = filler_ids(tokenizer, max(16, length - overhead), offset=seed * 7919)
    pieces, start = [], 0
    for depth in sorted(needles):
        cut = int(depth * len(filler))
        pieces += [tokenizer.decode(filler[start:cut]), needles[depth]]
        start = cut
    pieces.append(tokenizer.decode(filler[start:]))
    return [{"role": "user", "content": f"{instruction}\n\n{''.join(pieces)}\n\n{question}"}]


def keys(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [str(int(x)) for x in rng.integers(10000, 99999, count)]
