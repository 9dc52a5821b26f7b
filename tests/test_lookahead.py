"""Lookahead decoding: the pool, the window, the one-forward attention mask, greedy equality, lossless sampling."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec_lab import generate
from specdec_lab.drafters.lookahead import LookaheadDrafter, LookaheadWindow, NgramPool, candidate_tree
from specdec_lab.models import load_model, zoo_path
from specdec_lab.sampling import SamplingConfig
from specdec_lab.train.corpus import heldout_prompts


def test_pool_keeps_the_most_recent_continuations_per_key():
    pool = NgramPool(ngram=3, size=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    pool.add([1, 2, 3])  # seen again: most recent
    pool.add([1, 6, 7])  # evicts the least recent, (4, 5)
    pool.add([9, 9, 9])
    assert pool.candidates(1) == [(6, 7), (2, 3)]
    assert pool.candidates(9) == [(9, 9)] and pool.candidates(4) == []
    assert len(pool) == 3
    text = NgramPool(ngram=2, size=4)
    text.add_text([5, 6, 5, 7])
    assert text.candidates(5) == [(7,), (6,)]
    with pytest.raises(ValueError, match="3-grams"):
        pool.add([1, 2])


def test_candidate_tree_shares_prefixes():
    tree = candidate_tree([(4, 5, 6), (4, 5, 7), (8, 5, 6)])
    assert tree.tokens.tolist() == [4, 5, 6, 7, 8, 5, 6]
    assert tree.parents.tolist() == [-1, 0, 1, 1, -1, 4, 5]
    assert [tree.tokens[path].tolist() for path in tree.paths()] == [[4, 5, 6], [4, 5, 7], [8, 5, 6]]


def test_window_fills_then_completes_one_ngram_per_column():
    window = LookaheadWindow(width=2, ngram=3, levels=[[1, 2]])
    assert window.advance([3, 4]) == []  # warm-up: the second level fills
    assert window.advance([5, 6]) == [[1, 3, 5], [2, 4, 6]]
    assert window.levels == [[3, 4], [5, 6]]
    assert window.offsets() == [1, 2, 2, 3]


def expected_slots(candidates, levels):
    """Each slot of a lookahead step, named by what the method says it is, in the documented row order.

    Returns, per slot, (name, position offset from the root, set of visible slot names). Built from the
    method's description alone: a candidate node is its token prefix and sees its own prefixes; window row
    (level l, column i) sees level 0 columns 0..i and column i at levels 1..l.
    """
    nodes = list(dict.fromkeys(tuple(c[:d]) for c in candidates for d in range(1, len(c) + 1)))
    slots = [("root", 0, {"root"})]
    slots += [(("node", p), len(p), {"root"} | {("node", p[:d]) for d in range(1, len(p) + 1)}) for p in nodes]
    width = len(levels[0])
    for level, column in itertools.product(range(len(levels)), range(width)):
        seen = {"root"} | {("row", 0, j) for j in range(column + 1)} | {("row", m, column) for m in range(1, level + 1)}
        slots.append((("row", level, column), 1 + column + level, seen))
    return slots


def test_every_row_sees_exactly_what_the_method_says(llama_factory, prompts):
    model = llama_factory(vocab_size=64, hidden_size=48, num_layers=2, seed=0, logit_scale=4.0)
    calls, drafts = [], []

    def record(module, args, kwargs, output):
        calls.append((kwargs["input_ids"][0].clone(), kwargs.get("attention_mask"), kwargs.get("position_ids"),
                      output.logits[0].clone()))

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        out = generate(model, prompts[2], drafter=LookaheadDrafter(window=3, ngram=3, pool_size=3),
                       max_new_tokens=24, on_step=lambda step: drafts.append(step.draft))
    finally:
        handle.remove()
    text = prompts[2] + out.tokens
    checked_full = 0
    for (ids, mask, positions, logits), draft in zip(calls[1:], drafts, strict=True):  # calls[0]: prefill
        slots = expected_slots(draft.info["candidates"], draft.info["levels"])
        names = [name for name, _, _ in slots]
        past = mask.shape[-1] - len(slots)
        assert ids[0] == text[past]  # the root is the last committed token
        visible = mask[0, 0] == 0
        assert visible[:, :past].all()  # the cached prefix is visible to every row
        for row, (name, offset, seen) in enumerate(slots):
            assert int(positions[0, row]) == past + offset
            assert {names[j] for j in visible[row, past:].nonzero().flatten().tolist()} == seen, name
            # ...and what it sees is a causal sequence: the row's logits are those of plain decoding after it.
            path = sorted((slots[names.index(s)][1], int(ids[names.index(s)])) for s in seen)
            assert [offset for offset, _ in path] == list(range(len(path)))
            with torch.inference_mode():
                sequential = model(torch.tensor([text[:past] + [token for _, token in path]])).logits[0, -1]
            torch.testing.assert_close(logits[row], sequential, atol=1e-4, rtol=0)
        checked_full += len(draft.info["levels"]) == 2 and len(draft.info["candidates"]) >= 2
    assert checked_full >= 2  # steps with a full window and several candidates were checked


@pytest.mark.parametrize("window, ngram, pool_size", [(3, 3, 3), (5, 4, 5), (4, 2, 2)])
def test_greedy_equals_plain_decoding(tiny_target, prompts, window, ngram, pool_size):
    accepted = 0
    for prompt in prompts:
        plain = generate(tiny_target, prompt, max_new_tokens=40)
        drafter = LookaheadDrafter(window=window, ngram=ngram, pool_size=pool_size)
        out = generate(tiny_target, prompt, drafter=drafter, max_new_tokens=40)
        assert out.tokens == plain.tokens
        accepted += out.stats.accepted
    assert accepted > 100  # the verification branch really did accept pool n-grams


def test_greedy_equals_plain_decoding_on_heldout_code():
    target, tokenizer = load_model(zoo_path() / "target")
    accepted = 0
    for text in heldout_prompts(20):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = generate(target, ids, max_new_tokens=24)
        out = generate(target, ids, drafter=LookaheadDrafter(window=4, ngram=3, pool_size=4), max_new_tokens=24)
        assert out.tokens == plain.tokens, text
        accepted += out.stats.accepted
    assert accepted > 0


def test_bad_settings_are_rejected():
    for bad in ({"window": 0}, {"ngram": 1}, {"pool_size": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LookaheadDrafter(**bad)


def test_sampling_is_lossless(llama_factory, chi_square, sequence_probabilities):
    model = llama_factory(vocab_size=4, hidden_size=16, num_layers=1, seed=3, logit_scale=3.0)
    # A repetitive prompt seeds the pool with several n-grams per key: the multi-candidate rule is exercised.
    prompt, length, config = [1, 2, 1, 3, 1, 0, 2, 1], 3, SamplingConfig(temperature=0.9)
    sequences, exact = sequence_probabilities(model, prompt, length, config)
    counts = torch.zeros(len(sequences))
    samples, accepted = 1200, 0
    for seed in range(samples):
        out = generate(model, prompt, drafter=LookaheadDrafter(window=2, ngram=2, pool_size=3), max_new_tokens=length,
                       temperature=0.9, seed=seed)
        counts[sequences.index(tuple(out.tokens))] += 1
        accepted += out.stats.accepted
    assert accepted > samples // 8
    assert chi_square(counts, torch.tensor(exact)) > 1e-3
