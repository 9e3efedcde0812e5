"""Tables and plots of the quality evaluation: docs/quality.md between the generated markers, and the PNGs."""

from __future__ import annotations

import collections
import pathlib
import re

from quest_ort.model_folder.settings import BUDGET_PAGE_TOKENS

from .harness import pyplot
from .quality_retrieval import retrieval_table

BEGIN, END = "<!-- BEGIN GENERATED: benchmarks/eval_quality.py -->", "<!-- END GENERATED -->"
MEASURES = ("every token sparse", "continuation")
MEASURE_TITLES = {
    "every token sparse": "every token sparse (teacher-forced, each token selects its blocks)",
    "continuation": "continuation (the first {continuation_from} tokens prefilled exactly, the rest sparse; "
                    "tokens {continuation_from}..{last} scored)",
}


def policy_key(row) -> tuple:
    return (row["block_size"], row["group_reduce"], row["sink_blocks"], row["recent_blocks"])


def policy_label(key) -> str:
    P, reduce, sink, recent = key
    return f"P{P} {reduce} s{sink} r{recent}"


def _default_key(model) -> tuple:
    s = model["default_settings"]
    return (s["block_size"], s["group_reduce"], s["sink_blocks"], s["recent_blocks"])


def _short_length(length) -> str:
    return f"{int(length) // 1024}K"


def prompt_id(row) -> tuple:
    return (row["length"], row["depth"], row["key"])


def dense_hits(model) -> dict[tuple, bool]:
    return {prompt_id(r): r["hit"] for r in model["pass_key"] if r["config"] == "dense"}


def keys_lost(model, prefill: str = "exact") -> dict[tuple, dict[int, int]]:
    """(policy key, budget) -> {length: prompts dense answers and the policy does not}."""
    dense = dense_hits(model)
    lost = collections.defaultdict(lambda: collections.Counter())
    for r in model["pass_key"]:
        if r["config"] != "dense" and r["prefill"] == prefill:
            lost[(policy_key(r), r["budget"])][r["length"]] += dense[prompt_id(r)] and not r["hit"]
    return lost


def _header(budgets) -> list[str]:
    """The head of a policy x budget table."""
    return ["| policy | " + " | ".join(f"{b} tokens" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]


def _policy_rows(model, cells: dict[tuple, dict[int, str]], budgets) -> list[str]:
    """One table row per policy (sorted), its budgets' cells; the default export's cell in bold."""
    default_key, default_budget = _default_key(model), model["default_settings"]["top_k"] * model["default_settings"]["block_size"]
    lines = []
    for key in sorted(cells):
        values = []
        for budget in budgets:
            value = cells[key].get(budget, "")
            values.append(f"**{value}**" if key == default_key and budget == default_budget and value else value)
        label = policy_label(key) + (" (default)" if key == default_key else "")
        lines.append(f"| {label} | " + " | ".join(values) + " |")
    return lines


def _lengths(model) -> list[int]:
    return sorted(int(length) for length in model["lengths"])


def pass_key_tables(model) -> list[str]:
    dense = dense_hits(model)
    lines = []
    for length in _lengths(model):
        prompts = [p for p in dense if p[0] == length]
        found = sum(dense[p] for p in prompts)
        lines += [f"**{length} tokens** (dense retrieves {found} of {len(prompts)}): keys retrieved where dense "
                  "retrieves them / of all keys, exact prefill", ""] + _header(model["budgets"])
        counts = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0]))
        for r in model["pass_key"]:
            if r["length"] == length and r["config"] != "dense" and r["prefill"] == "exact":
                cell = counts[policy_key(r)][r["budget"]]
                cell[0] += r["hit"] and dense[prompt_id(r)]
                cell[1] += r["hit"]
                cell[2] += 1
        cells = {key: {b: f"{c[0]}/{found} ({c[1]}/{c[2]})" for b, c in row.items()} for key, row in counts.items()}
        lines += _policy_rows(model, cells, model["budgets"]) + [""]
    return lines


def prefill_table(model) -> list[str]:
    """The default export and the old default, exact against per-token prefill, per length."""
    dense = dense_hits(model)
    lengths = _lengths(model)
    wanted = [(model["default"], "exact", "default"), (model["default"], "per-token", "default"),
              (model["old_default"], "exact", "old default"), (model["old_default"], "per-token", "old default")]
    lines = ["Exact against per-token prefill (keys retrieved where dense retrieves them, of the keys dense retrieves):",
             "", "| export | prefill | " + " | ".join(f"{_short_length(n)}" for n in lengths) + " | lost |",
             "|---|---|" + "---|" * (len(lengths) + 1)]
    seen = set()
    for config, prefill, label in wanted:
        if (config, prefill) in seen:
            continue
        seen.add((config, prefill))
        rows = [r for r in model["pass_key"] if r["config"] == config and r["prefill"] == prefill]
        if not rows:
            continue
        names = " = ".join(l for c, p, l in wanted if c == config and p == prefill)
        cells, lost = [], 0
        for length in lengths:
            mine = [r for r in rows if r["length"] == length]
            hit = sum(r["hit"] and dense[prompt_id(r)] for r in mine)
            lost += sum(dense[prompt_id(r)] and not r["hit"] for r in mine)
            cells.append(f"{hit}/{sum(dense[prompt_id(r)] for r in mine)}")
        lines.append(f"| {names} ({config}) | {prefill} | " + " | ".join(cells) + f" | {lost} |")
    return lines + [""]


def lost_table(model) -> list[str]:
    lengths = _lengths(model)
    lines = [f"Keys lost (dense retrieves the key, the policy does not), exact prefill; in brackets per length "
             f"({' / '.join(_short_length(n) for n in lengths)}):", ""] + _header(model["budgets"])
    cells = collections.defaultdict(dict)
    for (key, budget), per_length in keys_lost(model).items():
        counts = [per_length.get(n, 0) for n in lengths]
        cells[key][budget] = f"{sum(counts)} ({' / '.join(map(str, counts))})"
    return lines + _policy_rows(model, cells, model["budgets"]) + [""]


def recall_table(model) -> list[str]:
    sums = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in model["pass_key"]:
        if r["config"] != "dense" and r["prefill"] == "exact" and r.get("recall") is not None:
            cell = sums[(policy_key(r), r["budget"])]
            cell[0] += r["recall"]
            cell[1] += r["reads"]
            cell[2] += 1
    if not sums:
        return []
    lines = ["Attention-mass recall at the first answer token (the share of the exact attention mass in the blocks a "
             "KV head reads, mean over prompts, sparse layers and KV heads) / tokens a KV head reads, relative to "
             "the budget (above 1: the union of its query heads' lists):", ""] + _header(model["budgets"])
    cells = collections.defaultdict(dict)
    for (key, budget), (recall, reads, count) in sums.items():
        cells[key][budget] = f"{recall / count:.3f} / {reads / count:.2f}x"
    return lines + _policy_rows(model, cells, model["budgets"]) + [""]


def dense_perplexity(model, measure: str) -> float:
    return next(r["perplexity"] for r in model["perplexity"] if r["config"] == "dense" and r["measure"] == measure)


def perplexity_tables(model) -> list[str]:
    lines = []
    last = model["perplexity_tokens"] - 1
    for measure in MEASURES:
        dense = dense_perplexity(model, measure)
        title = MEASURE_TITLES[measure].format(continuation_from=model["continuation_from"], last=last)
        lines += [f"Perplexity, {title}; dense {dense:.3f}; in brackets the change relative to dense:", ""]
        lines += _header(model["perplexity_budgets"])
        cells = collections.defaultdict(dict)
        for r in model["perplexity"]:
            if r["config"] != "dense" and r["measure"] == measure:
                cells[policy_key(r)][r["budget"]] = f"{r['perplexity']:.3f} ({(r['perplexity'] / dense - 1) * 100:+.1f}%)"
        lines += _policy_rows(model, cells, model["perplexity_budgets"]) + [""]
    return lines


def summary(model) -> list[str]:
    """The facts that choose defaults: no key lost at `--k 32`'s budget; perplexity within 1% at 1024 tokens."""
    lost, budget_k32 = keys_lost(model), 32 * BUDGET_PAGE_TOKENS
    clean = [key for (key, budget), per_length in lost.items() if budget == budget_k32 and not sum(per_length.values())]
    lines = [f"Policies that lose no key dense retrieves at `--k 32` (a budget of {budget_k32} tokens): "
             + (", ".join(policy_label(k) for k in sorted(clean)) or "none") + "."]
    for measure in MEASURES:
        dense = dense_perplexity(model, measure)
        close = sorted(policy_key(r) for r in model["perplexity"]
                       if r["measure"] == measure and r["budget"] == 1024 and r["perplexity"] <= dense * 1.01)
        lines.append(f"Within 1% of dense perplexity at 1024 tokens, {measure}: "
                     + (", ".join(policy_label(k) for k in close) or "none") + ".")
    return [f"- {line}" for line in lines] + [""]


def cache_type_table(model) -> list[str]:
    """The default export with float16 and int8 KV caches (and int8 caches with float16 bounds):
    keys retrieved per prompt length and both perplexities, the change against float16 in brackets."""
    types = model.get("cache_types")
    if not types:  # reports written before the comparison
        return []
    if "caches" not in types:  # reports written before the variants had labels: one per cache dtype
        types = dict(types, caches=types["kv_dtypes"],
                     **{part: [dict(r, cache=r["kv_dtype"]) for r in types[part]] for part in ("pass_key", "perplexity")})
    lengths = _lengths(model)
    lines = ["| KV cache | " + " | ".join(f"keys at {_short_length(n)}" for n in lengths)
             + " | " + " | ".join(f"perplexity, {m}" for m in MEASURES) + " |",
             "|---" * (1 + len(lengths) + len(MEASURES)) + "|"]
    baseline = {r["measure"]: r["perplexity"] for r in types["perplexity"] if r["cache"] == types["caches"][0]}
    for dtype in types["caches"]:
        rows = [r for r in types["pass_key"] if r["cache"] == dtype]
        keys = [f"{sum(r['retrieved'] for r in rows if r['length'] == n)} of {sum(r['length'] == n for r in rows)}"
                for n in lengths]
        ppl = {r["measure"]: r["perplexity"] for r in types["perplexity"] if r["cache"] == dtype}
        cells = [f"{ppl[m]:.3f} ({(ppl[m] / baseline[m] - 1) * 100:+.2f}%)" for m in MEASURES]
        refused = "†" if dtype in types.get("refused", {}) else ""
        lines.append(f"| {dtype}{refused} | " + " | ".join(keys + cells) + " |")
    notes = [f"†: the export with {label} caches is refused by its validation ({message}); measured on an "
             "export without validation." for label, message in types.get("refused", {}).items()]
    return ["The default export with each KV cache type (every other setting the default's: int8 caches come "
            "with int8 block bounds, and once with float16 ones to tell their share), through "
            "`Generator(model).generate` and the perplexity measures at the default budget; in brackets the "
            f"change against {types['caches'][0]}:", ""] + lines + [""] + ([" ".join(notes), ""] if notes else [])


def _model_header(model) -> list[str]:
    s, checks, phases = model["default_settings"], model["checks"], model["phases"]
    prompts = ", ".join(f"{count} per depth at {_short_length(n)}" for n, count in sorted(
        (int(n), c) for n, c in model["lengths"].items()))
    timing = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
    timing += f"; {model['cpu_seconds']} s of CPU time"
    return [f"Model: {model['layers']} layers, {model['heads']} query heads on {model['kv_heads']} KV "
            f"heads, head dim {model['head_dim']}, layers {model['dense_layers']} dense. Default export "
            f"(`export-sparse --k 32` as the run's code wrote it): P={s['block_size']}, K={s['top_k']} "
            f"({s['top_k'] * s['block_size']} tokens), group_reduce {s['group_reduce']}, sink "
            f"{s['sink_blocks']}, recent {s['recent_blocks']} ({model['default']}); bounds {model['bounds_dtype']}, "
            f"caches {model['kv_dtype']}. Pass keys at {len(model['depths'])} depths, {prompts}; "
            f"{model['answer_tokens']} greedy tokens each. Run time {model['seconds']} s ({timing}).",
            "", f"Checks: the evaluation's decode of the default export equals `Generator(model).generate` on "
            f"{checks['generator_agrees']} of {checks['prompts']} prompts (a difference stops the run); the variant of "
            f"the default's own settings, with shared unprepacked weights like every other policy, gives the same "
            f"answer on {checks['shared_weights_agree']} of {checks['prompts']}.", ""]


def default_check_table(model) -> list[str]:
    """`--only-default`: the default export against dense through Generator, every key of the plan,
    and both perplexity measures (eval_quality.run_default_check)."""
    check = model.get("default_check")
    if not check:
        return []
    s, rows = check["settings"], check["pass_key"]
    lines = [f"The default export as `export-sparse --k 32` writes it now ({check['default']}: P={s['block_size']}, "
             f"K={s['top_k']}, {s['top_k'] * s['block_size']} tokens per query head), every prompt through "
             "`Generator(model).generate`, against the dense reference decoded from that exact prefill "
             f"({check['answer_tokens']} greedy tokens; "
             f"`make eval EVAL_ARGS=\"--only-default ...\"`, {check['seconds']} s on {check['threads'] or 'all'} "
             "threads). Keys per prompt length: those dense retrieves, those the default retrieves of them, lost:", "",
             "| length | prompts | dense | default (of dense's) | lost |", "|---|---|---|---|---|"]
    for length in sorted({r["length"] for r in rows}):
        dense = {prompt_id(r): r["hit"] for r in rows if r["length"] == length and r["model"] == "dense"}
        default = {prompt_id(r): r["hit"] for r in rows if r["length"] == length and r["model"] == "default"}
        kept = sum(dense[case] and default[case] for case in dense)
        lines.append(f"| {length} | {len(dense)} | {sum(dense.values())} | {kept} (all: "
                     f"{sum(default.values())}) | {'**' if kept < sum(dense.values()) else ''}"
                     f"{sum(dense.values()) - kept}{'**' if kept < sum(dense.values()) else ''} |")
    lines += ["", f"Perplexity over {check['perplexity_tokens']} tokens (continuation from {check['continuation_from']}):", "",
              "| measure | dense | default | change |", "|---|---|---|---|"]
    for measure in MEASURES:
        dense = next(r["perplexity"] for r in check["perplexity"] if r["config"] == "dense" and r["measure"] == measure)
        default = next(r["perplexity"] for r in check["perplexity"] if r["config"] == check["default"]
                       and r["measure"] == measure)
        lines.append(f"| {measure} | {dense:.3f} | {default:.3f} | {(default / dense - 1) * 100:+.2f}% |")
    return lines + [""]


def markdown(report) -> list[str]:
    lines = [BEGIN, ""]
    for name, model in report["models"].items():
        lines += [f"### {model['model']}", ""] + _model_header(model) + summary(model)
        lines += (["#### The default export, checked", ""] + default_check_table(model)) if model.get("default_check") else []
        lines += ["#### Pass-key retrieval", ""] + prefill_table(model) + lost_table(model) + pass_key_tables(model)
        lines += recall_table(model) + ["#### Perplexity", ""] + perplexity_tables(model)
        lines += (["#### Harder retrieval", ""] + retrieval_table(model)) if model.get("harder_retrieval") else []
        lines += (["#### KV cache types", ""] + cache_type_table(model)) if model.get("cache_types") else []
    lines += ["![pass key](quality_passkey.png)", "", "![perplexity](quality_perplexity.png)", "", END]
    return lines


def _budget_axis(ax, budgets) -> None:
    ax.set_xscale("log")
    ax.set_xticks(list(budgets), [str(b) for b in budgets])
    ax.minorticks_off()
    ax.set_xlabel("budget (tokens)")


def _plots(report, folder: pathlib.Path) -> bool:
    plt = pyplot("quality_passkey.png and quality_perplexity.png")
    if plt is None:
        return False
    import matplotlib.ticker

    models = list(report["models"].values())
    columns = max(len(_lengths(m)) for m in models)
    fig, axes = plt.subplots(len(models), columns, figsize=(4.5 * columns, 3.8 * len(models)), squeeze=False,
                             sharey=True)
    for row, model in enumerate(models):
        dense = dense_hits(model)
        for column, length in enumerate(_lengths(model)):
            ax = axes[row][column]
            shares = collections.defaultdict(lambda: collections.defaultdict(list))
            for r in model["pass_key"]:
                if r["length"] == length and r["config"] != "dense" and r["prefill"] == "exact" and dense[prompt_id(r)]:
                    shares[policy_key(r)][r["budget"]].append(r["hit"])
            for key, cells in sorted(shares.items()):
                budgets = sorted(cells)
                ax.plot(budgets, [sum(cells[b]) / len(cells[b]) for b in budgets], marker="o",
                        linestyle="-" if key[1] == "none" else "--", label=policy_label(key))
            _budget_axis(ax, model["budgets"])
            ax.set(title=f"{model['model'].split(' (')[0]}, {length} tokens")
        axes[row][0].set_ylabel("share of the keys dense retrieves")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(folder / "quality_passkey.png", dpi=90)
    fig, axes = plt.subplots(len(models), len(MEASURES), figsize=(6 * len(MEASURES), 4 * len(models)), squeeze=False)
    for row, model in enumerate(models):
        for column, measure in enumerate(MEASURES):
            ax = axes[row][column]
            dense = dense_perplexity(model, measure)
            series = collections.defaultdict(dict)
            for r in model["perplexity"]:
                if r["config"] != "dense" and r["measure"] == measure:
                    series[policy_key(r)][r["budget"]] = (r["perplexity"] / dense - 1) * 100
            for key, cells in sorted(series.items()):
                budgets = sorted(cells)
                ax.plot(budgets, [cells[b] for b in budgets], marker="o",
                        linestyle="-" if key[1] == "none" else "--", label=policy_label(key))
            ax.axhline(1, color="gray", linestyle=":", label="dense + 1%")
            _budget_axis(ax, model["perplexity_budgets"])
            ax.set_yscale("symlog", linthresh=1)  # linear within +-1%, logarithmic beyond
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:+g}%"))
            ax.set(ylabel="change from dense (%)", title=f"{model['model'].split(' (')[0]}: {measure}")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(folder / "quality_perplexity.png", dpi=90)
    plt.close("all")
    return True


def write_report(report, folder: pathlib.Path, plots: bool = True) -> bool:
    """The generated part of folder/quality.md (the text around the markers is kept) and the plots;
    whether the plots were drawn (not where asked not to, nor without matplotlib)."""
    path = folder / "quality.md"
    text = path.read_text() if path.is_file() else "# Quality with real weights\n\n" + BEGIN + "\n" + END + "\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: "\n".join(markdown(report)), text))
    return plots and _plots(report, folder)
