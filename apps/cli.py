"""The `quest-ort` command: `chat FOLDER` (a terminal chat) and `serve FOLDER` (an OpenAI-compatible server).

    quest-ort chat qwen3-quest --max-new-tokens 256
    quest-ort chat qwen3-quest --prefill sparse # long prompts answered sooner (docs/quality.md)
    quest-ort serve qwen3-quest --port 8000     # then any OpenAI client at http://127.0.0.1:8000/v1
    quest-ort serve qwen3-quest --replicas 2    # two processes behind one address (Ray Serve)
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import time

from ..runtime.generate import PREFILL_MODES
from ..runtime.sampling import Sampling
from .console import add_logging_flags, bar, configure_logging

log = logging.getLogger("quest_ort")

CHAT_HELP = "/reset starts the conversation again, /exit (or Ctrl-D) leaves; Ctrl-C stops a reply."
# A prompt of more new tokens than this shows a progress bar while it is prefilled.
PREFILL_BAR_TOKENS = 1024


# `quest-ort chat`'s sampling flags: Sampling's fields (runtime/sampling.py), with its defaults.
SAMPLING_FLAGS = (("temperature", float, "0 (the default): greedy"), ("top_p", float, None), ("top_k", int, None),
                  ("min_p", float, None), ("presence_penalty", float, None), ("frequency_penalty", float, None),
                  ("repetition_penalty", float, None), ("seed", int, None))


def _sampling_options(args) -> dict:
    options = {name: getattr(args, name) for name, _, _ in SAMPLING_FLAGS if getattr(args, name) is not None}
    return {**options, "max_new_tokens": args.max_new_tokens}


class PrefillBar:
    """A progress bar (console.bar: on a terminal only) for a prefill of PREFILL_BAR_TOKENS or more."""

    def __init__(self):
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None and total >= PREFILL_BAR_TOKENS:
            self.bar = bar(total, "tok", "prefill")
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def chat(args, read_line=input, write=sys.stdout.write) -> int:
    """The interactive chat: one line per turn, the reply streamed, then its speed and the context used."""
    from ..runtime.chat import Chat, TextGenerator
    from ..runtime.model import CapacityError, QuestModel

    model = QuestModel(args.folder, threads=args.threads)
    generator = TextGenerator(model, prefill=args.prefill)
    conversation = Chat(model, system=args.system, generator=generator, **_sampling_options(args))
    log.info("%s: %d layers, capacity %d tokens. %s", args.folder, model.sidecar.geometry.num_layers,
             generator.capacity, CHAT_HELP)
    while True:
        try:
            line = read_line(">>> ")
        except EOFError:
            write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            conversation.reset()
            log.info("(conversation reset)")
            continue
        if text.startswith("/"):
            log.warning("unknown command %s. %s", text, CHAT_HELP)
            continue
        prefill_bar = PrefillBar()
        started = time.perf_counter()
        try:
            reply = conversation.send(text, stream=True, on_prefill=prefill_bar)
        except (CapacityError, ValueError) as error:
            log.error("%s (/reset starts again)", error)
            continue
        first = None
        try:
            with reply:
                for delta in reply:
                    if first is None:
                        prefill_bar.close()
                        first = time.perf_counter()
                    write(delta)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            write(" [stopped]")
        prefill_bar.close()
        write("\n")
        end = time.perf_counter()
        tokens = reply.usage.completion_tokens
        speed = (tokens - 1) / (end - first) if first is not None and tokens > 1 and end > first else 0.0
        log.info("[%d tokens, %.1f tokens/s, first after %.2f s, %d of %d tokens of context used, %d reused]",
                 tokens, speed, (first or end) - started, generator.context_used, generator.capacity,
                 reply.usage.reused_tokens)


# What pyproject.toml's serve extra installs, and the packages they bring (apps/serve/ imports them).
SERVE_EXTRA_MODULES = frozenset({"fastapi", "uvicorn", "prometheus_client", "starlette", "pydantic", "anyio"})


def serve(args) -> int:
    if args.replicas > 1:
        return serve_replicas(args)
    try:
        from .serve import serve as run_server
    except ModuleNotFoundError as error:  # a wheel installed without its serve extra
        if (error.name or "").partition(".")[0] not in SERVE_EXTRA_MODULES:
            raise  # not the extra: a real fault, with its traceback
        log.error("quest-ort serve needs the serve extra (%s is not installed): pip install 'quest-ort[serve]'",
                  error.name)
        return 2
    run_server(args.folder, host=args.host, port=args.port, name=args.name, threads=args.threads,
               prefill=args.prefill, log_level="debug" if args.verbose else "warning" if args.quiet else "info",
               parallel=args.parallel, queue=args.queue, slot_save_path=args.slot_save_path)
    return 0


def serve_replicas(args) -> int:
    from .replicas import RayServeMissingError, ReplicaStartError, serve_replicas as run_replicas

    try:
        run_replicas(args.folder, args.replicas, host=args.host, port=args.port, name=args.name, threads=args.threads,
                     prefill=args.prefill, log_level="debug" if args.verbose else "warning" if args.quiet else "info")
    except (RayServeMissingError, ReplicaStartError) as error:
        log.error("quest-ort serve --replicas: %s", error)
        return 2
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quest-ort", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("folder", type=pathlib.Path, help="a folder written by export-sparse (with its tokenizer)")
    common.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    common.add_argument("--prefill", choices=PREFILL_MODES, default="exact",
                        help="how prompts are prefilled: exact (the default: every prompt token attends to all before "
                             "it), sparse (chunks of prompt tokens select their blocks: a long prompt's first token "
                             "several times sooner, docs/quality.md), or per-token (each selects as decode does)")
    add_logging_flags(common)

    talk = commands.add_parser("chat", parents=[common], help="chat in the terminal", description=CHAT_HELP)
    talk.add_argument("--system", default=None, help="a system prompt")
    talk.add_argument("--max-new-tokens", type=int, default=512, help="longest reply (default 512)")
    for name, kind, help_text in SAMPLING_FLAGS:
        default = getattr(Sampling, name)
        talk.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                          help=help_text or ("default: none" if default is None else f"default {default}"))
    talk.set_defaults(run=chat)

    http = commands.add_parser("serve", parents=[common], help="an OpenAI-compatible HTTP server")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8000)
    http.add_argument("--name", default=None, help="the model's name in the API (default: the folder's name)")
    http.add_argument("--replicas", type=_positive, default=1,
                      help="N > 1: N processes, each with its own session and cache, behind one address (Ray Serve, "
                           "the replicas extra; --threads is then per replica, default the cores shared out)")
    http.add_argument("--parallel", type=_positive, default=None,
                      help="requests run at once, each in a slot (a row of the cache), their decode steps batched "
                           "(default: the slots whose caches fit in half the available memory, at most 4)")
    http.add_argument("--queue", type=_not_negative, default=64,
                      help="requests that may wait for a slot (default 64); past them a 503 with Retry-After")
    http.add_argument("--slot-save-path", type=pathlib.Path, default=None,
                      help="a folder for POST /slots/ID?action=save|restore (llama.cpp's endpoints): a slot's cached "
                           "tokens written to and read from a file there, checked against this model folder")
    http.set_defaults(run=serve)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose, args.quiet)
    from ..model_folder.sidecar import ModelFolderError
    from ..runtime.text import TokenizerMissingError

    try:
        return args.run(args)
    except (FileNotFoundError, ModelFolderError, TokenizerMissingError) as error:
        log.error("quest-ort %s: %s", args.command, error)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
