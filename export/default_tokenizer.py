"""The tokenizer of the embedded default models: a byte-level BPE built from rules, no corpus, no download.

The default models have random weights, so no trained vocabulary fits them; what they need is a
tokenizer with the same mechanics as a real one, so that the text API, the chat CLI and the server
run on them as on SmolLM2: special tokens, a chat template, an end-of-turn id to stop at, and any
id the model emits decoding to text.

    ids 0, 1, 2            <|endoftext|>, <|im_start|>, <|im_end|> (SmolLM2's ids; <|im_end|> ends a turn)
    ids 3 .. 258           the 256 bytes (byte-level: any text encodes, any id decodes)
    ids 259 .. vocab - 1   merges of two printable characters, commonest letters first ("e" + " "),
                           then of each merged token and one more character ("e " + "t"), and so on:
                           any vocabulary size (Qwen3's 151936 included) fills up

Saved as transformers saves a fast tokenizer (tokenizer.json, tokenizer_config.json with the
ChatML template), so `transformers.AutoTokenizer` reads the folder too.
"""

from __future__ import annotations

import json
import pathlib

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
END_OF_TURN_ID = 2
FIRST_BYTE_ID = len(SPECIAL_TOKENS)
SMALLEST_VOCAB = FIRST_BYTE_ID + 256

# ChatML, as Qwen and SmolLM2 format a conversation (written here; whitespace trimmed as
# transformers renders templates: trim_blocks and lstrip_blocks).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Printable ASCII, the commonest characters of English text first: the merges pair them in this order.
_MERGE_ORDER = (" etaoinshrdlucmfwypvbgkjqxz" "ETAOINSHRDLUCMFWYPVBGKJQXZ" ".,'\"-?!:;()0123456789"
                "\n/*&%$#@+=<>[]{}_|\\^`~")


def byte_symbols() -> list[str]:
    """The printable character byte-level BPE writes for each byte value 0..255: the printable
    Latin-1 bytes stand for themselves, the others (controls, space, ...) for 256 + their rank."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, spare = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + spare)
            spare += 1
    return [symbols[byte] for byte in range(256)]


def _merge_pairs(letters: list[str]):
    """The merges to offer, in order, without end: pairs of letters by the sum of their ranks ("e "
    before "zz"), then each token of the level before followed by one letter, level after level."""
    level = []
    for rank in range(2 * len(letters) - 1):
        for first in range(max(0, rank - len(letters) + 1), min(rank, len(letters) - 1) + 1):
            level.append((letters[first], letters[rank - first]))
            yield level[-1]
    while True:  # built as offered: a vocabulary that fills early never builds the whole level
        longer = []
        for left, right in level:
            for letter in letters:
                longer.append((left + right, letter))
                yield longer[-1]
        level = longer


def build_tokenizer(vocab_size: int):
    """A `tokenizers.Tokenizer` of exactly `vocab_size` ids (at least SMALLEST_VOCAB)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < SMALLEST_VOCAB:
        raise ValueError(f"a byte-level tokenizer needs a vocabulary of at least {SMALLEST_VOCAB}, got {vocab_size}")
    symbols = byte_symbols()
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({symbol: FIRST_BYTE_ID + byte for byte, symbol in enumerate(symbols)})
    merges = []
    for pair in _merge_pairs([symbols[ord(c)] for c in _MERGE_ORDER]):
        if len(vocab) == vocab_size:
            break
        if pair[0] + pair[1] not in vocab:
            vocab[pair[0] + pair[1]] = len(vocab)
            merges.append(pair)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    return tokenizer


def save_default_tokenizer(directory: pathlib.Path, vocab_size: int) -> bool:
    """Write the default tokenizer into `directory` for a model of `vocab_size` ids; False (nothing
    written) when the vocabulary is too small to hold the bytes (the tests' tiniest models)."""
    if vocab_size < SMALLEST_VOCAB:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(vocab_size).save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": SPECIAL_TOKENS[END_OF_TURN_ID],
        "pad_token": SPECIAL_TOKENS[0],
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return True
