"""A model folder's tokenizer and chat template, and text streamed out of generated tokens.

The exporter copies the source's tokenizer files into the folder's `tokenizer/` (the sidecar names
it). They are read here with Hugging Face's `tokenizers` (tokenizer.json) and the chat template is
rendered with jinja2 in a sandbox, with the whitespace rules and helpers transformers gives
templates, so a conversation becomes the tokens transformers' `apply_chat_template` gives.

```python
tokenizer = FolderTokenizer.from_folder("qwen3-quest")
ids = tokenizer.encode_chat([{"role": "user", "content": "Hi"}])  # ends with the assistant's header
deltas = TextDeltas(tokenizer)
text = "".join(deltas.add(token) for token in generated) + deltas.finish()
```
"""

from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Sequence


class TokenizerMissingError(FileNotFoundError):
    """The folder has no tokenizer (its source had none): token ids only."""


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's fields."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: pathlib.Path, config: dict) -> str | None:
    """The chat template: chat_template.jinja, else tokenizer_config.json's (a string, or named
    templates of which 'default' is the chat one)."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class FolderTokenizer:
    """Text to token ids and back, and conversations through the chat template."""

    def __init__(self, folder: pathlib.Path):
        from tokenizers import Tokenizer

        self.folder = pathlib.Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerMissingError(f"{self.folder}: no tokenizer.json (the text API reads the fast tokenizer "
                                        "format that transformers saves)")
        self._tokenizer = Tokenizer.from_file(str(path))
        config_path = self.folder / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.special_tokens = {name: _token_text(self.config.get(name))
                               for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        self.chat_template = _chat_template(self.folder, self.config)
        self._template = None

    @classmethod
    def from_folder(cls, model_folder) -> FolderTokenizer:
        """The tokenizer of an exported model folder (its sidecar names the tokenizer's folder)."""
        from ..model_folder.sidecar import Sidecar

        model_folder = pathlib.Path(model_folder)
        sidecar = Sidecar.read(model_folder)
        if sidecar.tokenizer is None:
            raise TokenizerMissingError(f"{model_folder}: the export has no tokenizer (its source had none); "
                                        "run it with token ids (runtime/generate.py)")
        return cls(model_folder / sidecar.tokenizer)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def longest_token_characters(self) -> int:
        """An upper bound on the characters of text one token covers: twice the longest vocabulary
        entry (a byte-level entry holds a character per byte, at least one byte per character; the
        margin for normalisers). Text longer than capacity x this cannot fit the context."""
        if getattr(self, "_longest", None) is None:
            self._longest = 2 * max(len(entry) for entry in self._tokenizer.get_vocab(with_added_tokens=True))
        return self._longest

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`; `add_special_tokens` adds what the tokenizer's post-processor adds to a
        plain prompt (a BOS token, for some)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
        """The conversation as the chat template writes it (ending with the assistant's header when
        `add_generation_prompt`)."""
        if self.chat_template is None:
            raise ValueError(f"{self.folder}: the tokenizer has no chat template; use plain prompts (generate_text)")
        checked = []
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {message!r:.80}")
            checked.append(message)
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        return self._template.render(messages=checked, add_generation_prompt=add_generation_prompt,
                                     **{name: value for name, value in self.special_tokens.items() if value})

    def encode_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> list[int]:
        """The conversation's token ids, as transformers' apply_chat_template gives them (the
        template writes every special token itself, so the post-processor adds none)."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt),
                           add_special_tokens=False)


def _compile_template(source: str):
    """The template in a sandbox with transformers' settings (trim_blocks, lstrip_blocks, loop
    controls) and the helpers chat templates call (raise_exception, strftime_now, tojson)."""
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                               extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return environment.from_string(source)


class TextDeltas:
    """The text each new token adds, for streaming: a token that ends inside a multi-byte character
    (or a word the decoder still joins) adds nothing until the text it belongs to is complete.

    Each token's text is read as the difference between decoding a short window with and without
    it, so a decoder that treats the first token specially (a leading space) still gives the text
    of the whole reply; joined, the deltas and finish() are decode(all tokens)."""

    def __init__(self, tokenizer: FolderTokenizer, *, skip_special_tokens: bool = True):
        self._tokenizer, self._skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self._start = 0  # the window's first token: the context the next delta is decoded in
        self._done = 0  # tokens whose text was given out

    def _decode(self, ids) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def add(self, token: int) -> str:
        self.ids.append(int(token))
        given = self._decode(self.ids[self._start:self._done])
        text = self._decode(self.ids[self._start:])
        if len(text) <= len(given) or text.endswith("\ufffd") or not text.startswith(given):
            return ""  # an incomplete character, or a decoder still reworking the window
        self._start, self._done = self._done, len(self.ids)
        return text[len(given):]

    def finish(self) -> str:
        """What the tokens held back still add (an incomplete character as U+FFFD)."""
        given = self._decode(self.ids[self._start:self._done])
        text = self._decode(self.ids[self._start:])
        self._start = self._done = len(self.ids)
        # What was given out stays given: the rest is what follows its length (a decoder that reworked
        # the window's start cannot take back what a reader already has).
        return text[len(given):]


class StopText:
    """Stop strings over streamed text: gives out the text up to (not including) the first stop
    string to end, holding back an ending that could still grow into one. Each stop string is
    matched by its Knuth-Morris-Pratt automaton, one state per string carried from delta to delta:
    the work is linear in the text and the strings' lengths, whatever they hold."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stop for stop in stops if stop)
        self._fallback = [_prefix_function(stop) for stop in self.stops]
        self._matched = [0] * len(self.stops)  # per stop: its longest prefix the text ends with
        self._pending = ""
        self.stopped = False

    def add(self, delta: str) -> str:
        if self.stopped:
            return ""
        text = self._pending + delta
        start = len(self._pending)
        for offset, char in enumerate(delta):
            for i, stop in enumerate(self.stops):
                k = self._matched[i]
                while k and stop[k] != char:
                    k = self._fallback[i][k - 1]
                k += stop[k] == char
                if k == len(stop):
                    self.stopped = True
                    self._pending = ""
                    return text[: start + offset + 1 - k]
                self._matched[i] = k
        hold = max(self._matched, default=0)  # what could still grow into a stop string
        self._pending = text[len(text) - hold:] if hold else ""
        return text[: len(text) - hold]

    def finish(self) -> str:
        text, self._pending = self._pending, ""
        return "" if self.stopped else text


def _prefix_function(pattern: str) -> list[int]:
    """table[i]: the length of the longest proper prefix of pattern[: i + 1] that is also its suffix."""
    table = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = table[k - 1]
        k += pattern[i] == pattern[k]
        table[i] = k
    return table
