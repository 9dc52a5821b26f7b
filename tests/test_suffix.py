"""Suffix decoding: the suffix index counts every substring, the drafter follows the longest match and the most
frequent continuation, drafts further for longer matches and stops where its continuation gets uncertain, and
its output is target-only greedy decoding (lossless sampling follows from the one-hot q of any model-free draft,
checked for prompt lookup in test_decode)."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec_lab import SuffixDrafter, generate
from specdec_lab.drafters.prompt_lookup import find_continuation
from specdec_lab.drafters.suffix import SuffixIndex


def occurrences(tokens: list[int], string: list[int]) -> int:
    """Brute force: how often `string` occurs in `tokens` (overlaps counted)."""
    n = len(string)
    return sum(tokens[i : i + n] == string for i in range(len(tokens) - n + 1))


def drafter_over(tokens: list[int], **settings) -> SuffixDrafter:
    drafter = SuffixDrafter(**settings)
    drafter.index.extend(tokens)
    return drafter


def test_the_index_counts_every_substring_up_to_its_depth():
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 3, (60,), generator=generator).tolist()
    index = SuffixIndex(max_depth=4)
    index.extend(tokens[:30])
    index.extend(tokens[30:])  # built in two goes, as the drafter feeds it
    for length in range(1, 5):
        for string in itertools.product(range(3), repeat=length):
            node = index.node(list(string))
            assert (node.count if node else 0) == occurrences(tokens, list(string)), string
    assert index.node(tokens[:5]) is None  # nothing deeper than max_depth is indexed
    assert all(node.depth == length for length, node in enumerate(index.active))


def test_the_match_is_the_longest_suffix_that_occurred_before_with_a_follower():
    #           0  1  2  3  4  5  6  7  8  9  10 11
    tokens = [7, 1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3]  # suffix "1 2 3" occurred at 1..3 (followed by 9)
    index = SuffixIndex(max_depth=8)
    index.extend(tokens)
    node = index.match()
    assert node.depth == 3 and list(node.children) == [9]
    index.append(4)  # "... 3 4": no suffix ending in 4 occurred before
    assert index.match() is None


def test_frequency_beats_recency_where_prompt_lookup_takes_the_latest():
    # After "5 6" came 7 three times, then 9 once, most recently.
    tokens = [5, 6, 7, 0, 5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 9, 3, 5, 6]
    assert find_continuation(torch.tensor(tokens), 2, 1, 1).tolist() == [9]
    assert drafter_over(tokens, min_probability=0.0).draft(1) == [7]
    # Ties go to the most recent continuation.
    assert drafter_over([5, 6, 7, 0, 5, 6, 9, 0, 5, 6], min_probability=0.0).draft(1) == [9]


def test_a_longer_match_drafts_further():
    text = list(range(10, 30))
    short = drafter_over([*text, 0, 10], factor=2.0, min_probability=0.0)  # match length 1: budget 2
    long = drafter_over([*text, 0, 10, 11, 12, 13], factor=2.0, min_probability=0.0)  # match length 4: budget 8
    assert short.draft(16) == [11, 12]
    assert long.draft(16) == list(range(14, 22))
    assert long.draft(3) == [14, 15, 16]  # and never more than asked


def test_an_uncertain_continuation_ends_the_draft():
    # "1 2 3" was followed by 4 twice and by 5 twice: the continuation's empirical probability halves there.
    tokens = [1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 9, 1, 2]
    confident = drafter_over(tokens, factor=4.0, min_probability=0.6)
    assert confident.draft(16) == [3]  # "1 2" -> 3 is certain; 3 -> 4 or 5 would drop it to 0.5
    assert drafter_over(tokens, factor=4.0, min_probability=0.4).draft(16)[:2] == [3, 5]  # 5: the most recent of a tie


def test_drafting_continues_past_the_depth_limit_from_a_shorter_suffix():
    cycle = [1, 2, 3, 4, 5]
    drafter = drafter_over(cycle * 6, max_depth=4, k=12, factor=10.0, min_probability=0.0)
    assert drafter.draft(12) == (cycle * 3)[:12]


def test_bad_settings_name_the_problem():
    for settings, message in (({"k": 0}, "k "), ({"factor": 0}, "factor"),
                              ({"min_probability": 1.0}, "min_probability"), ({"max_depth": 1}, "max_depth"),
                              ({"min_match": 0}, "min_match")):
        with pytest.raises(ValueError, match=message):
            SuffixDrafter(**settings)


def test_greedy_output_equals_plain_decoding_and_drafts_are_used(tiny_target, prompts):
    accepted = 0
    for prompt in prompts[:8]:
        repetitive = prompt * 3  # give the index something to match
        plain = generate(tiny_target, repetitive, max_new_tokens=24)
        out = generate(tiny_target, repetitive, drafter=SuffixDrafter(), max_new_tokens=24)
        assert out.tokens == plain.tokens
        accepted += out.stats.accepted
    assert accepted > 0


def test_sampled_output_is_reproducible_and_the_drafter_restarts_per_generation(tiny_target, prompts):
    drafter = SuffixDrafter()
    first = generate(tiny_target, prompts[0] * 2, drafter=drafter, max_new_tokens=16, temperature=1.0, seed=3)
    generate(tiny_target, prompts[1], drafter=drafter, max_new_tokens=8)
    again = generate(tiny_target, prompts[0] * 2, drafter=drafter, max_new_tokens=16, temperature=1.0, seed=3)
    assert first.tokens == again.tokens
    context = prompts[0] * 2 + again.tokens
    assert drafter.index.tokens == context[: len(drafter.index.tokens)]  # only this generation's tokens
    assert len(drafter.index.tokens) > 2 * len(prompts[0])
