"""Harder retrieval in `make eval`: several keys in one prompt with the question naming one, and a key asked twice in one conversation.

Multi-key. Each prompt hides MULTI_KEYS keys of the same form, each for a named lock, at depths
spread over the filler, and asks for one lock's key: the lock asked cycles, so its depth takes each
place in turn (and the locks' order rotates every MULTI_KEYS prompts). A hit is the asked key in the answer; `confused` marks an answer that holds
another lock's key instead.

Asked twice. The single pass-key prompt, its greedy reply, then a second user turn asking for the
key again: the conversation as a chat template writes it, with the reply's text in it (what `Chat`
sends: its slots reuse the first turn's prefill, which gives the same tokens as a fresh one, a
tested property of runtime/slots.py). Both turns' answers are recorded.

Both run through `Generator(model).generate` on the default export and on the dense reference, the
prompts built with the checkpoint's own tokenizer and chat template.
"""

from __future__ import annotations

import dataclasses

from .quality_inputs import keys, needle_messages, pass_key_messages

MULTI_KEYS = 4
LOCKS = ("the red door", "the blue gate", "the green safe", "the white locker")
MULTI_INSTRUCTION = ("There are several pass keys hidden inside a lot of irrelevant text, each for a different lock. "
                     "Find them and memorize them. I will quiz you about one of them.")
AGAIN = "What was the pass key again? Answer with the number only."
# Greedy tokens per multi-key answer: the answer restates the lock ("The pass key for the white locker
# is 40758."), and 12 tokens cut the key short (measured on SmolLM2: "... white locker is 40").
MULTI_KEY_ANSWER_TOKENS = 24


def lock_sentence(lock: str, key: str) -> str:
    return f"The pass key for {lock} is {key}. Remember it. {key} is the pass key for {lock}."


def lock_question(lock: str) -> str:
    return f"What is the pass key for {lock}? Answer with the number only."


@dataclasses.dataclass(frozen=True)
class MultiKeyPrompt:
    length: int
    keys: tuple[str, ...]  # one per lock, in LOCKS' order
    depths: tuple[float, ...]  # where each lock's sentence sits in the filler (0..1)
    asked: int  # the lock the question names
    ids: tuple[int, ...]

    @property
    def key(self) -> str:
        return self.keys[self.asked]


def multi_key_prompt(tokenizer, length: int, index: int) -> MultiKeyPrompt:
    """About `length` tokens: MULTI_KEYS lock sentences at evenly spread depths (their order rotated
    every MULTI_KEYS prompts), the question naming lock `index % MULTI_KEYS`: the asked key's depth
    takes every place in turn."""
    lock_keys = tuple(keys(MULTI_KEYS, seed=1000 * length + index))
    spread = [(0.5 + slot) / MULTI_KEYS for slot in range(MULTI_KEYS)]
    depths = tuple(spread[(lock + index // MULTI_KEYS) % MULTI_KEYS] for lock in range(MULTI_KEYS))
    asked = index % MULTI_KEYS
    needles = {depths[lock]: f" {lock_sentence(LOCKS[lock], lock_keys[lock])} " for lock in range(MULTI_KEYS)}
    messages = needle_messages(tokenizer, MULTI_INSTRUCTION, needles, lock_question(LOCKS[asked]), length, index + 1)
    return MultiKeyPrompt(length, lock_keys, depths, asked,
                          tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))


def multi_key_prompts(tokenizer, lengths, per_length: int) -> list[MultiKeyPrompt]:
    return [multi_key_prompt(tokenizer, length, index) for length in lengths for index in range(per_length)]


def second_turn(tokenizer, first_messages: list[dict], reply: str) -> list[int]:
    """The conversation after the first reply, with the key asked again, as the template writes it."""
    messages = first_messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": AGAIN}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def run_multi_key(models: dict, tokenizer, prompts: list[MultiKeyPrompt], answer_tokens: int,
                  log=lambda message: None) -> list[dict]:
    """Every prompt through `Generator(model).generate` of each of `models` (label -> model); `log`
    gets a progress line per prompt (an 8K prompt takes minutes)."""
    from quest_ort.runtime.generate import Generator, Sampling

    sampling = Sampling(max_new_tokens=answer_tokens)
    rows = []
    for label, model in models.items():
        generator = Generator(model)
        for done, prompt in enumerate(prompts, 1):
            answer = tokenizer.decode(generator.generate([list(prompt.ids)], sampling)[0], skip_special_tokens=True)
            others = [key for lock, key in enumerate(prompt.keys) if lock != prompt.asked]
            rows.append(dict(task="multi-key", model=label, length=prompt.length, asked=LOCKS[prompt.asked],
                             depth=prompt.depths[prompt.asked], key=prompt.key, answer=answer.strip(),
                             hit=prompt.key in answer,
                             confused=prompt.key not in answer and any(key in answer for key in others)))
            log(f"multi-key, {label}: {done} of {len(prompts)} prompts ({prompt.length} tokens: "
                f"{'found' if rows[-1]['hit'] else 'missed'})")
    return rows


def run_asked_twice(models: dict, tokenizer, lengths, depths, answer_tokens: int,
                    log=lambda message: None) -> list[dict]:
    """A pass-key prompt per (length, depth), its reply, then the key asked again; through
    `Generator(model).generate` of each of `models`; `log` gets a progress line per conversation."""
    from quest_ort.runtime.generate import Generator, Sampling

    sampling = Sampling(max_new_tokens=answer_tokens)
    rows = []
    for label, model in models.items():
        generator = Generator(model)
        for length in lengths:
            for index, depth in enumerate(depths):
                key = keys(1, seed=2000 * length + index)[0]
                messages = pass_key_messages(tokenizer, key, length, depth, seed=index + 11)
                first = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
                reply = tokenizer.decode(generator.generate([first], sampling)[0], skip_special_tokens=True).strip()
                second = second_turn(tokenizer, messages, reply)
                again = tokenizer.decode(generator.generate([second], sampling)[0], skip_special_tokens=True).strip()
                rows.append(dict(task="asked twice", model=label, length=length, depth=depth, key=key,
                                 first_answer=reply, second_answer=again, first_hit=key in reply,
                                 hit=key in again))
                log(f"asked twice, {label}: {sum(r['model'] == label for r in rows)} of "
                    f"{len(lengths) * len(depths)} conversations ({length} tokens: "
                    f"{'found' if rows[-1]['hit'] else 'missed'} the second time)")
    return rows


def retrieval_table(model: dict) -> list[str]:
    """Per task and prompt length: the answers dense gets, the default export's, and how many of
    dense's the default loses (docs/quality.md)."""
    harder = model.get("harder_retrieval")
    if not harder:
        return []
    rows = harder["rows"]
    lines = ["| task | length | dense | default | lost (dense right, default not) | default confused |",
             "|---|---|---|---|---|---|"]
    for task in ("multi-key", "asked twice"):
        for length in sorted({r["length"] for r in rows if r["task"] == task}):
            picked = [r for r in rows if r["task"] == task and r["length"] == length]
            dense = {_case(r): r["hit"] for r in picked if r["model"] == "dense"}
            default = [r for r in picked if r["model"] == "default"]
            lost = sum(dense[_case(r)] and not r["hit"] for r in default)
            confused = sum(r.get("confused", False) for r in default)
            lines.append(f"| {task} | {length} | {sum(dense.values())} of {len(dense)} | "
                         f"{sum(r['hit'] for r in default)} of {len(default)} | {lost} | {confused} |")
    return [f"{MULTI_KEYS} keys for named locks at spread depths, the question naming one (multi-key); the "
            "single pass key asked, answered, then asked again in the same conversation (asked twice: the "
            "second answer counts). The default export "
            + (f"({harder['default']}) " if "default" in harder else "")
            + "and the dense reference, through `Generator(model).generate`, "
            f"{harder.get('multi_key_answer_tokens', harder['answer_tokens'])} greedy tokens per multi-key answer, "
            f"{harder['answer_tokens']} per asked-twice answer:", ""] + lines + [""]


def _case(row: dict) -> tuple:
    return (row["length"], row["depth"], row["key"])
