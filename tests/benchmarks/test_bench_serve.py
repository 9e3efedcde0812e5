"""bench_serve's measures on made-up replies: the decode window, its rate and the first-token check."""

from __future__ import annotations

from benchmarks.bench_serve import round_summary


def _reply(stamps, counts, tokens):
    return {"stamps": stamps, "counts": counts, "completion_tokens": tokens}


def test_the_decode_rate_counts_the_tokens_inside_the_window_where_every_client_decodes():
    # client a decodes from 1 s to 5 s, client b from 2 s to 6 s: the window is (2, 5]
    a = _reply([1.0, 2.5, 3.0, 5.0], [1, 2, 2, 1], 6)
    b = _reply([2.0, 4.0, 6.0], [1, 3, 1], 5)
    summary = round_summary([a, b])
    assert summary["decode_window_s"] == 3.0
    assert summary["decode_tokens_per_s"] == round((2 + 2 + 1 + 3) / 3.0, 2)
    assert summary["run_tokens_per_s"] == round(11 / 5.0, 2)
    assert summary["last_first_token_before_first_end"]


def test_replies_one_after_another_have_no_common_window():
    summary = round_summary([_reply([1.0, 2.0], [1, 1], 2), _reply([3.0, 4.0], [1, 1], 2)])
    assert summary["decode_tokens_per_s"] is None and not summary["last_first_token_before_first_end"]
