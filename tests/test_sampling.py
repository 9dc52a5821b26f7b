"""Sampling settings: validation, and logits -> probabilities exactly as Hugging Face's warpers do it."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec_lab.sampling import SamplingConfig, make_generator, process_logits, sample, sample_without_replacement


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Reference: the same processing through transformers' own warpers (temperature, top-k, top-p)."""
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, -1)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, None, None), (0.7, None, None), (1.3, 5, None), (1.0, None, 0.8), (0.7, 10, 0.9), (1.0, None, 0.05),
])
def test_processing_matches_hugging_face_warpers(temperature, top_k, top_p):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    probs = process_logits(logits, SamplingConfig(temperature, top_k, top_p))
    torch.testing.assert_close(probs, hf_probs(logits, temperature, top_k, top_p), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))


def test_greedy_is_one_hot_at_the_argmax_for_any_leading_shape():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(1))
    probs = process_logits(logits, SamplingConfig(0.0))
    assert probs.shape == logits.shape
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(2, 3))
    assert SamplingConfig(0.0).greedy and not SamplingConfig(0.5).greedy


def test_top_k_keeps_exactly_k_tokens_and_top_p_keeps_the_smallest_sufficient_set():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert (process_logits(logits, SamplingConfig(1.0, top_k=2)) > 0).sum() == 2
    kept = process_logits(logits, SamplingConfig(1.0, top_p=0.65)) > 0  # 0.4 < 0.65 <= 0.4 + 0.3
    assert kept.tolist() == [True, True, False, False]
    top_only = process_logits(logits, SamplingConfig(1.0, top_p=0.01))  # the top token always stays
    assert top_only.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_settings_that_keep_everything_change_nothing():
    logits = torch.randn(9, generator=torch.Generator().manual_seed(2))
    plain = process_logits(logits, SamplingConfig(1.0))
    torch.testing.assert_close(process_logits(logits, SamplingConfig(1.0, top_k=9, top_p=1.0)), plain)
    torch.testing.assert_close(plain, torch.softmax(logits, -1))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": 1.0, "top_p": 0.0}, "top_p must lie in (0, 1]"),
    ({"temperature": 1.0, "top_p": 1.5}, "top_p must lie in (0, 1]"),
    ({"temperature": 1.0, "top_p": -0.2}, "top_p must lie in (0, 1]"),
    ({"temperature": 1.0, "top_k": 0}, "top_k must be a positive integer"),
    ({"temperature": 1.0, "top_k": 2.5}, "top_k must be a positive integer"),
])
def test_bad_settings_are_refused_with_a_message_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SamplingConfig(**kwargs)


def test_sampling_is_reproducible_from_the_seed_and_follows_the_distribution():
    probs = torch.tensor([0.1, 0.6, 0.3])
    first = [int(sample(probs, make_generator(7))) for _ in range(3)]
    again = [int(sample(probs, make_generator(7))) for _ in range(3)]
    assert first == again
    draws = sample(probs.expand(4000, 3), make_generator(3))
    assert draws.shape == (4000,)
    frequencies = torch.bincount(draws, minlength=3) / 4000
    torch.testing.assert_close(frequencies, probs, atol=0.03, rtol=0)  # 4 standard errors at most
    assert int(sample(torch.tensor([0.0, 0.0, 1.0]), make_generator(0))) == 2


def test_sampling_without_replacement_draws_in_order_from_the_conditional_q(chi_square):
    # Gumbel-top-k must match sequential draws: the first token ~ q, the second ~ q without the first.
    q = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    generator = make_generator(0)
    first, second = torch.zeros(5), torch.zeros(5, 5)
    for _ in range(4000):
        tokens, conditionals = sample_without_replacement(q, 2, generator)
        first[tokens[0]] += 1
        second[tokens[0], tokens[1]] += 1
        torch.testing.assert_close(conditionals[0], q)
        expected = q.clone()
        expected[tokens[0]] = 0
        torch.testing.assert_close(conditionals[1], expected / expected.sum())
    assert chi_square(first, q) > 1e-3
    pairs = q[:, None] * q[None, :] / (1 - q[:, None])
    pairs.fill_diagonal_(0)
    assert chi_square(second, pairs) > 1e-3
    skewed = second.T.contiguous()  # the same pairs in the wrong order: the test can tell
    assert chi_square(skewed, pairs) < 1e-6


def test_sampling_without_replacement_stops_at_the_support_and_checks_its_count():
    q = torch.tensor([0.0, 0.7, 0.0, 0.3])
    tokens, conditionals = sample_without_replacement(q, 5, make_generator(1))
    assert sorted(tokens.tolist()) == [1, 3] and conditionals.shape == (2, 4)
    assert sample_without_replacement(q, 0, make_generator(1))[0].numel() == 0
    with pytest.raises(ValueError, match="non-negative integer"):
        sample_without_replacement(q, -1, make_generator(1))
