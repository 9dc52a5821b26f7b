"""Verification rules: greedy matching, and the lossless rejection rule proved lossless statistically.

The rejection rule is checked three ways: exact enumeration of its output distribution (the randomness it
draws is replaced by a fine grid of uniforms and a sampler that reports the distribution it was asked to
sample from), a chi-square test on real seeded samples, and, to show that both checks have the power to
catch the classic mistakes, the same checks run against deliberately broken variants, which must fail.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import pytest
import torch

from specdec_lab.sampling import sample
from specdec_lab.verify import Verdict, residual_distribution, verify_greedy, verify_rejection

# --- A re-implementation with pluggable parts, to build the broken variants ------------------------------------


def inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Sample by inverting the cumulative sum, as hand-written samplers do: it trusts `probs` to sum to 1."""
    u = torch.rand(1, generator=generator, device=probs.device)
    index = torch.searchsorted(probs.cumsum(-1), u)
    return index.clamp(max=probs.shape[-1] - 1)[0]


def argmax_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Not a sample at all: the most likely token."""
    return probs.argmax(-1)


def chain_rule(draft_tokens, target_probs, draft_probs, generator, *, residual=residual_distribution,
               draw=sample, bonus_draw=sample, bonus_row_offset=0, swap_p_and_q=False) -> Verdict:
    """Chain rejection verification written out again with replaceable parts (correct with the defaults).

    residual(p, q): what to sample from at the first rejection; draw / bonus_draw(probs, generator): how
    the correction / the bonus token is drawn; bonus_row_offset: 1 reads the bonus distribution one row too
    early; swap_p_and_q: accept with min(1, q/p) instead of min(1, p/q).
    """
    k = len(draft_tokens)
    positions = torch.arange(k)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).to(target_probs.dtype)
    p_x, q_x = target_probs[positions, draft_tokens], draft_probs[positions, draft_tokens]
    if swap_p_and_q:
        p_x, q_x = q_x, p_x
    u = torch.rand(k, generator=generator)
    rejected = (u * q_x >= p_x).nonzero()
    if len(rejected) == 0:
        return Verdict(k, int(bonus_draw(target_probs[k - bonus_row_offset], generator)), resampled=False)
    n = int(rejected[0])
    return Verdict(n, int(draw(residual(target_probs[n], draft_probs[n]), generator)), resampled=True)


BROKEN_RULES = {
    "resample from p instead of the residual": partial(chain_rule, residual=lambda p, q: p),
    "residual not clipped at 0 (|p - q|)": partial(chain_rule, residual=lambda p, q: (p - q).abs()),
    "residual not normalised": partial(chain_rule, residual=lambda p, q: (p - q).clamp(min=0), draw=inverse_cdf_draw),
    "p and q swapped": partial(chain_rule, residual=lambda p, q: residual_distribution(q, p), swap_p_and_q=True),
    "bonus token from the previous position": partial(chain_rule, bonus_row_offset=1),
    "bonus token not sampled (argmax)": partial(chain_rule, bonus_draw=argmax_draw),
}
# Broken variants whose randomness goes through torch.rand (acceptance) and torch.multinomial (draws) only,
# so that exact enumeration applies to them (the inverse-CDF draw uses torch.rand a second time).
ENUMERABLE_BROKEN = [name for name in BROKEN_RULES if name != "residual not normalised"]


# --- Fixed distributions -------------------------------------------------------------------------------------


def distribution(logits: list[float]) -> torch.Tensor:
    return torch.softmax(torch.tensor(logits), -1)


P0 = distribution([2.0, 1.0, 0.5, 0.0, -1.0])
P1 = distribution([-1.0, 0.0, 2.0, 0.3, 1.0])
P2 = distribution([0.0, 1.5, -0.5, 1.0, 0.2])
Q0 = distribution([3.5, -1.0, 2.0, -1.0, 0.0])  # overlaps P0 partly: both acceptance and rejection are common
Q1 = distribution([0.0, 2.5, 1.0, 0.0, -2.0])
SPARSE_P = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])  # as after top-k / top-p
PAIRS = {
    "overlapping": (P0, Q0),
    "sparse target": (SPARSE_P, Q0),
    "disjoint supports": (torch.tensor([0.6, 0.4, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0])),
    "draft equals target": (P0, P0),
    "sharp draft": (P0, distribution([9.0, 0.0, 0.0, 0.0, 0.0])),
}


# --- Greedy and residual ---------------------------------------------------------------------------------------


def one_hot_logits(argmaxes: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), vocab)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 1.0
    return logits


def test_greedy_accepts_the_whole_matching_draft_and_adds_the_bonus_argmax():
    verdict = verify_greedy(torch.tensor([3, 1, 4]), one_hot_logits([3, 1, 4, 5]))
    assert verdict == Verdict(accepted=3, next_token=5, resampled=False)


def test_greedy_stops_at_the_first_mismatch_and_emits_the_target_argmax_there():
    verdict = verify_greedy(torch.tensor([3, 2, 4]), one_hot_logits([3, 1, 4, 5]))
    assert verdict == Verdict(accepted=1, next_token=1, resampled=True)


def test_greedy_with_an_empty_draft_is_plain_decoding():
    assert verify_greedy(torch.tensor([], dtype=torch.long), one_hot_logits([2])) == Verdict(0, 2, False)


def test_residual_is_the_clipped_normalised_difference():
    residual = residual_distribution(P0, Q0)
    expected = (P0 - Q0).clamp(min=0)
    torch.testing.assert_close(residual, expected / expected.sum())
    assert (residual[Q0 >= P0] == 0).all()


def test_residual_falls_back_to_p_when_p_equals_q():
    torch.testing.assert_close(residual_distribution(P0, P0.clone()), P0)


def test_deterministic_draft_token_with_target_probability_one_is_always_accepted():
    p = torch.nn.functional.one_hot(torch.tensor([2, 4]), 5).float()
    for seed in range(20):
        verdict = verify_rejection(torch.tensor([2]), p, None, torch.Generator().manual_seed(seed))
        assert verdict == Verdict(1, 4, False)


def test_draft_token_the_target_rules_out_is_always_rejected_and_never_emitted():
    p = torch.stack([SPARSE_P, P1])  # SPARSE_P gives token 1 probability 0
    for seed in range(50):
        verdict = verify_rejection(torch.tensor([1]), p, torch.stack([Q0]), torch.Generator().manual_seed(seed))
        assert verdict.accepted == 0 and verdict.resampled
        assert verdict.next_token != 1 and SPARSE_P[verdict.next_token] > 0


def test_draft_probability_zero_does_not_produce_nan_decisions():
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]])
    verdict = verify_rejection(torch.tensor([0]), torch.stack([P0, P1]), q, torch.Generator().manual_seed(0))
    assert verdict.accepted == 1  # p(x) > 0 = q(x): the ratio is infinite, so the token is kept


# --- Exact enumeration -----------------------------------------------------------------------------------------


@contextmanager
def controlled_randomness(monkeypatch):
    """Replace the rule's randomness: torch.rand returns `state["u"]`; torch.multinomial records the
    distribution it was asked to sample from (normalised, as multinomial would) and returns token 0."""
    state = {"u": 0.5, "asked": []}

    def fake_rand(*size, generator=None, device=None, dtype=None, **_):
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return torch.full(tuple(shape), state["u"])

    def fake_multinomial(probs, num_samples, replacement=False, *, generator=None, **_):
        rows = probs.double().reshape(-1, probs.shape[-1])
        assert rows.shape[0] == 1, "the rule should draw one token at a time"
        state["asked"].append(rows[0] / rows[0].sum())
        return torch.zeros(probs.shape[:-1] + (num_samples,), dtype=torch.long)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "rand", fake_rand)
        patch.setattr(torch, "multinomial", fake_multinomial)
        yield state


def enumerate_two_tokens(rule, p0, q0, p1, monkeypatch, grid: int = 500) -> torch.Tensor:
    """Exact joint distribution (V, V) of the first two tokens when `rule` verifies a one-token draft.

    The draft token x is drawn from q0 (enumerated); the rule's uniform u runs over a midpoint grid, which
    gets each acceptance probability right to within 1 / (2 grid), so the joint to within that in total
    variation. After an acceptance the second token is
    the rule's bonus token; after a rejection it comes from the next decoding step, i.e. from p1.
    """
    vocab = p0.shape[0]
    target_probs = torch.stack([p0, p1])
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    with controlled_randomness(monkeypatch) as state:
        for x in range(vocab):
            if q0[x] == 0:
                continue
            for j in range(grid):
                state["u"], state["asked"] = (j + 0.5) / grid, []
                verdict = rule(torch.tensor([x]), target_probs, q0[None], None)
                assert len(state["asked"]) <= 1, "the rule should draw at most one token"
                # A rule that picked its token without drawing one emitted it with certainty.
                drawn = state["asked"][0] if state["asked"] else one_hot(verdict.next_token, vocab)
                weight = float(q0[x]) / grid
                if verdict.accepted == 1:
                    joint[x] += weight * drawn
                else:
                    joint += weight * torch.outer(drawn, p1.double())
    return joint


def one_hot(token: int, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab).double()


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().sum() / 2)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_exact_enumeration_of_rejection_rule_gives_the_target_distribution(pair, monkeypatch):
    p0, q0 = PAIRS[pair]
    joint = enumerate_two_tokens(verify_rejection, p0, q0, P1, monkeypatch)
    assert total_variation(joint, torch.outer(p0, P1)) < 2e-3  # grid error only


@pytest.mark.parametrize("broken", ENUMERABLE_BROKEN)
def test_exact_enumeration_exposes_each_broken_rule(broken, monkeypatch):
    p0, q0 = PAIRS["overlapping"]
    joint = enumerate_two_tokens(BROKEN_RULES[broken], p0, q0, P1, monkeypatch)
    assert total_variation(joint, torch.outer(p0, P1)) > 0.03


def test_exact_enumeration_of_the_reimplementation_with_correct_parts_is_exact(monkeypatch):
    p0, q0 = PAIRS["overlapping"]
    joint = enumerate_two_tokens(chain_rule, p0, q0, P1, monkeypatch)
    assert total_variation(joint, torch.outer(p0, P1)) < 2e-3


# --- Chi-square on real samples ----------------------------------------------------------------------------------

SAMPLES = 6000
ALPHA = 1e-3  # a correct rule must pass at this level; every broken one must fail far below it
BROKEN_ALPHA = 1e-6


def sampled_three_tokens(rule, deterministic: bool, samples: int, seed: int = 0) -> torch.Tensor:
    """Counts (V, V, V) of the first three tokens after verifying a two-token draft with `rule`.

    Positions are independent here (p0, p1, p2 do not depend on the earlier tokens), so the target's joint
    is p0 x p1 x p2. Draft tokens come from q0, q1 (or are the fixed ids 0 and 1 for a deterministic draft,
    q = one-hot); positions the verdict leaves open come from the next step, i.e. from the target.
    """
    generator = torch.Generator().manual_seed(seed)
    target_probs = torch.stack([P0, P1, P2])
    draft_probs = torch.stack([Q0, Q1])
    counts = torch.zeros(5, 5, 5)
    for _ in range(samples):
        if deterministic:
            draft, q = torch.tensor([0, 1]), None
        else:
            draft, q = sample(draft_probs, generator), draft_probs
        verdict = rule(draft, target_probs, q, generator)
        tokens = draft[: verdict.accepted].tolist() + [verdict.next_token]
        while len(tokens) < 3:
            tokens.append(int(sample(target_probs[len(tokens)], generator)))
        counts[tuple(tokens[:3])] += 1
    return counts


def target_three_tokens() -> torch.Tensor:
    return P0[:, None, None] * P1[None, :, None] * P2[None, None, :]


def test_chi_square_helper_accepts_exact_counts_and_rejects_wrong_ones(chi_square):
    probs = torch.tensor([0.5, 0.3, 0.2])
    assert chi_square(torch.tensor([500.0, 300.0, 200.0]), probs) > 0.99
    assert chi_square(torch.tensor([300.0, 300.0, 400.0]), probs) < 1e-10
    assert chi_square(torch.tensor([499.0, 300.0, 200.0, 1.0]), torch.tensor([0.5, 0.3, 0.2, 0.0])) == 0.0


@pytest.mark.parametrize("deterministic", [False, True], ids=["draft-model q", "deterministic draft"])
def test_rejection_rule_samples_the_target_distribution(deterministic, chi_square):
    counts = sampled_three_tokens(verify_rejection, deterministic, SAMPLES)
    assert chi_square(counts, target_three_tokens()) > ALPHA


@pytest.mark.parametrize("broken", list(BROKEN_RULES))
def test_chi_square_check_has_the_power_to_reject_each_broken_rule(broken, chi_square):
    rule = BROKEN_RULES[broken]
    p_values = [chi_square(sampled_three_tokens(rule, deterministic, SAMPLES // 2), target_three_tokens())
                for deterministic in (False, True)]
    # Every mistake is caught, with half the samples the real check uses, in at least one of the settings.
    assert min(p_values) < BROKEN_ALPHA, p_values
