"""Jacobi decoding: greedy output equals plain decoding, the commit rule, budgets, EOS, and lossless sampling."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec_lab import generate
from specdec_lab.drafters.jacobi import jacobi_decode, next_guesses
from specdec_lab.models import load_model, zoo_path
from specdec_lab.sampling import SamplingConfig
from specdec_lab.train.corpus import heldout_prompts


@pytest.mark.parametrize("window", [3, 8])
def test_greedy_equals_plain_decoding(tiny_target, prompts, window):
    taus = []
    for prompt in prompts:
        plain = generate(tiny_target, prompt, max_new_tokens=40)
        jacobi = jacobi_decode(tiny_target, prompt, window=window, max_new_tokens=40)
        assert jacobi.tokens == plain.tokens
        assert jacobi.stats.new_tokens == 40
        taus.append(jacobi.stats.mean_accepted_tokens)
    # Random models fall into loops, where Jacobi converges: the test exercises multi-token commits.
    assert max(taus) > 1.5


def test_greedy_equals_plain_decoding_on_heldout_code():
    target, tokenizer = load_model(zoo_path() / "target")
    tokens = forwards = 0
    for text in heldout_prompts(20):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = generate(target, ids, max_new_tokens=24)
        out = jacobi_decode(target, ids, window=4, max_new_tokens=24)
        assert out.tokens == plain.tokens, text
        tokens, forwards = tokens + out.stats.new_tokens, forwards + out.stats.target_forwards
    assert tokens / forwards > 1.0  # real text converges rarely, but code has stretches Jacobi gets in one go


def test_iterations_commit_the_self_reproducing_prefix(tiny_target, prompts):
    iterations = []
    out = jacobi_decode(tiny_target, prompts[0], window=5, max_new_tokens=30, on_iteration=iterations.append)
    assert out.stats.target_forwards == 1 + len(iterations)
    emitted = [t for it in iterations for t in it.emitted]
    assert emitted == out.tokens[1:]  # the prefill emits the first token
    for it in iterations:
        same = list(itertools.takewhile(lambda pair: pair[0] == pair[1], zip(it.guesses, it.refined, strict=False)))
        assert it.accepted == len(same)
        assert it.emitted == it.refined[: it.accepted + 1]


def test_next_guesses_keep_the_refined_tail():
    assert next_guesses([7, 8, 9, 10], accepted=1, window=3, fallback=0) == [9, 10, 10]
    assert next_guesses([7, 8, 9, 10], accepted=3, window=3, fallback=5) == [5, 5, 5]


def test_stops_at_eos_and_respects_the_budget(llama_factory, prompts):
    model = llama_factory(vocab_size=64, hidden_size=48, num_layers=2, seed=0, logit_scale=4.0)
    plain = generate(model, prompts[3], max_new_tokens=30)
    eos = plain.tokens[5]
    cut = plain.tokens[: plain.tokens.index(eos) + 1]
    out = jacobi_decode(model, prompts[3], window=6, max_new_tokens=30, eos_token_id=eos)
    assert out.tokens == cut and out.stopped_by == "eos"
    assert jacobi_decode(model, prompts[3], window=6, max_new_tokens=7).tokens == plain.tokens[:7]
    assert jacobi_decode(model, prompts[3], window=6, max_new_tokens=0).tokens == []


def test_bad_window_is_rejected(tiny_target):
    with pytest.raises(ValueError, match="window"):
        jacobi_decode(tiny_target, [1, 2, 3], window=0)


def test_sampling_is_lossless(llama_factory, chi_square, sequence_probabilities):
    model = llama_factory(vocab_size=4, hidden_size=16, num_layers=1, seed=3, logit_scale=3.0)
    prompt, length, config = [1, 2, 3], 3, SamplingConfig(temperature=0.9)
    sequences, exact = sequence_probabilities(model, prompt, length, config)
    counts = torch.zeros(len(sequences))
    samples, accepted = 1200, 0
    for seed in range(samples):
        out = jacobi_decode(model, prompt, window=3, max_new_tokens=length, temperature=0.9, seed=seed)
        counts[sequences.index(tuple(out.tokens))] += 1
        accepted += out.stats.accepted
    assert accepted > samples // 8  # guesses were accepted often: the rejection rule was exercised
    assert chi_square(counts, torch.tensor(exact)) > 1e-3
