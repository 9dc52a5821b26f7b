"""Adaptive draft length: drafting stops before a token the drafter is unsure of (largest q below a threshold).

Greedy runs must still equal plain decoding; sampling runs must still be distributed exactly as the target
(chi-square against the exact distribution), and a broken variant, one that drops a token after drawing it
because it came out unlikely, must fail the same test.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_bigram_llama
from test_decode import exact_first_tokens

import specdec_lab as sd
from specdec_lab.drafters.eagle import EagleConfig, EagleDrafter, EagleHead
from specdec_lab.sampling import SamplingConfig, confidence

VOCAB = 8


def eagle_head(target: torch.nn.Module, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(EagleConfig.from_target(target)).attach(target).eval()


def draft_lengths(target, prompt, drafter, **kwargs) -> tuple[list[int], list[int]]:
    """(new tokens, the length of every draft) of one generation."""
    lengths = []
    out = sd.generate(target, prompt, drafter=drafter, on_step=lambda step: lengths.append(len(step.draft)),
                      **kwargs)
    return out.tokens, lengths


@pytest.mark.parametrize("drafter_name", ["draft model", "eagle chain"])
def test_greedy_adaptive_drafts_equal_plain_decoding_and_vary_in_length(tiny_target, tiny_draft, prompts,
                                                                       drafter_name):
    head = eagle_head(tiny_target)
    all_lengths = []
    for prompt in prompts[:10]:
        # Thresholds near the lower quartile of each random drafter's (flat) confidence, measured once.
        drafter = sd.DraftModelDrafter(tiny_draft, k=6, min_confidence=0.035) if drafter_name == "draft model" \
            else EagleDrafter(head, mode="chain", depth=6, min_confidence=0.047)
        tokens, lengths = draft_lengths(tiny_target, prompt, drafter, max_new_tokens=24)
        assert tokens == sd.generate(tiny_target, prompt, max_new_tokens=24).tokens
        all_lengths += lengths[:-1]  # the last draft may be cut by max_new_tokens
    assert min(all_lengths) == 1 and max(all_lengths) == 6  # it did adapt, both ways


def test_a_draft_stops_exactly_where_the_drafters_confidence_drops(tiny_target, tiny_draft, prompts):
    # Replay every draft on the draft model itself: each kept token past the first was preceded by a
    # confident q, and a draft shorter than k stops where the next q is unsure.
    config = SamplingConfig(1.0)
    threshold = 0.05
    drafts = []
    out = sd.generate(tiny_target, prompts[0], drafter=sd.DraftModelDrafter(tiny_draft, k=5, min_confidence=threshold),
                      max_new_tokens=40, temperature=1.0, seed=0, on_step=drafts.append)
    context = list(prompts[0])
    for step in drafts:
        ids = torch.tensor([context + step.draft.tokens.tolist()])
        with torch.no_grad():
            logits = tiny_draft(ids).logits[0, len(context) - 1 :]
        sure = [confidence(row, config) >= threshold for row in logits]
        k = len(step.draft)
        assert all(sure[1:k])
        if k < 5 and len(context) + k < len(prompts[0]) + 40 - 1:
            assert not sure[k]
        context += step.emitted
    assert context[len(prompts[0]):] == out.tokens


class DropsUnlikelyDrawnTokens(sd.DraftModelDrafter):
    """BROKEN on purpose: ends the draft before the first token that came out unlikely under q (the stopping
    decision now depends on the drawn token, not on q alone; the draft may end up empty)."""

    def propose(self, state, max_tokens):
        draft = super().propose(state, max_tokens)
        q_of_drawn = draft.probs[torch.arange(len(draft)), draft.tokens]
        unlikely = (q_of_drawn < 0.3).nonzero()
        keep = int(unlikely[0]) if len(unlikely) else len(draft)
        return sd.Draft(draft.tokens[:keep], draft.probs[:keep])


@pytest.fixture(scope="module")
def bigram_world():
    """A target with known bigram-like distributions and a draft that perturbs them."""
    generator = torch.Generator().manual_seed(2)
    target_logits = 1.5 * torch.randn(VOCAB, VOCAB, generator=generator)
    draft_logits = target_logits + 1.5 * torch.randn(VOCAB, VOCAB, generator=generator)
    return make_bigram_llama(target_logits), make_bigram_llama(draft_logits, seed=1)


def sampled_joint(target, make_drafter, prompt, config: SamplingConfig, samples: int):
    counts = torch.zeros(VOCAB**3)
    lengths = set()
    for seed in range(samples):
        out = sd.generate(target, prompt, drafter=make_drafter(), max_new_tokens=3, temperature=config.temperature,
                          top_k=config.top_k, seed=seed, on_step=lambda step: lengths.add(len(step.draft)))
        a, b, c = out.tokens
        counts[(a * VOCAB + b) * VOCAB + c] += 1
    return counts, lengths


@pytest.mark.parametrize("config", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=3)], ids=["T=1", "T=0.7,top-k=3"])
def test_adaptive_sampling_is_lossless_and_a_token_dependent_stop_is_not(bigram_world, chi_square, config):
    target, draft = bigram_world
    prompt = [0, 3]
    exact = exact_first_tokens(target, prompt, config).reshape(-1)
    counts, lengths = sampled_joint(target, lambda: sd.DraftModelDrafter(draft, k=3, min_confidence=0.6), prompt,
                                    config, 1500)
    assert {1, 2} <= lengths  # the rule stopped early in some steps and not in others
    assert chi_square(counts, exact) > 1e-3
    broken, _ = sampled_joint(target, lambda: DropsUnlikelyDrawnTokens(draft, k=3), prompt, config, 1500)
    assert chi_square(broken, exact) < 1e-6


def test_bad_thresholds_are_rejected(tiny_target, tiny_draft):
    with pytest.raises(ValueError, match="min_confidence"):
        sd.DraftModelDrafter(tiny_draft, min_confidence=1.5)
    with pytest.raises(ValueError, match="chain mode only"):
        EagleDrafter(eagle_head(tiny_target), mode="tree", min_confidence=0.5)
