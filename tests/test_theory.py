"""The closed-form speed model: formula identities, edge cases, and agreement with a simulation."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_lab import theory


def test_tokens_per_step_is_the_geometric_sum():
    for alpha in (0.0, 0.3, 0.75, 0.99):
        for gamma in (0, 1, 4, 9):
            assert theory.expected_tokens_per_step(alpha, gamma) == pytest.approx(
                sum(alpha**i for i in range(gamma + 1)))


def test_edge_cases():
    assert theory.expected_tokens_per_step(1.0, 5) == 6.0
    assert theory.expected_tokens_per_step(0.0, 5) == 1.0
    assert theory.expected_tokens_per_step(0.6, 0) == 1.0
    assert theory.expected_accepted_draft_tokens(1.0, 3) == 3.0
    assert theory.expected_speedup(0.9, 0, 0.5) == 1.0  # no drafting, no change


def test_speedup_divides_by_step_cost():
    assert theory.expected_speedup(0.8, 4, 0.0) == pytest.approx(theory.expected_tokens_per_step(0.8, 4))
    assert theory.expected_speedup(0.8, 4, 0.25) == pytest.approx(theory.expected_tokens_per_step(0.8, 4) / 2.0)


def test_tokens_per_step_matches_a_simulation():
    """Accept each position with probability alpha until the first rejection: the mean tokens per step."""
    rng = random.Random(0)
    alpha, gamma, steps = 0.7, 5, 40_000
    total = 0
    for _ in range(steps):
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        total += accepted + 1
    assert total / steps == pytest.approx(theory.expected_tokens_per_step(alpha, gamma), abs=0.03)


def test_optimal_gamma_behaves():
    assert theory.optimal_gamma(0.0, 0.1) == 0  # a draft that is never accepted only costs time
    assert theory.optimal_gamma(0.9, 0.01) > theory.optimal_gamma(0.6, 0.01)
    assert theory.optimal_gamma(0.8, 0.01) >= theory.optimal_gamma(0.8, 0.2)
    best = theory.optimal_gamma(0.8, 0.05, max_gamma=20)
    assert all(theory.expected_speedup(0.8, best, 0.05) >= theory.expected_speedup(0.8, g, 0.05) for g in range(21))


def test_alpha_from_tau_inverts_the_formula():
    for alpha in (0.1, 0.5, 0.93):
        tau = theory.expected_tokens_per_step(alpha, 4)
        assert theory.alpha_from_tau(tau, 4) == pytest.approx(alpha, abs=1e-6)
    with pytest.raises(ValueError, match="tau must lie"):
        theory.alpha_from_tau(7.0, 4)


def test_acceptance_probability_is_overlap():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    assert float(theory.acceptance_probability(p, q)) == pytest.approx(0.7)
    assert float(theory.acceptance_probability(p, p)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="same shape"):
        theory.acceptance_probability(p, q[:2])


def test_grid_layout():
    grid = theory.speedup_grid([0.2, 0.5, 0.9], [1, 2], 0.1)
    assert len(grid) == 2 and len(grid[0]) == 3
    assert grid[1][2] == pytest.approx(theory.expected_speedup(0.9, 2, 0.1))


@pytest.mark.parametrize("call, message", [
    (lambda: theory.expected_tokens_per_step(1.2, 3), "alpha"),
    (lambda: theory.expected_tokens_per_step(0.5, -1), "gamma"),
    (lambda: theory.expected_tokens_per_step(0.5, 2.5), "gamma"),
    (lambda: theory.expected_speedup(0.5, 2, -0.1), "c "),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_seed_pitch_in_its_own_numbers():
    # A 3B draft at 3 ms and a 70B target at 30 ms: five drafts and one verification take 45 ms and emit up to
    # six tokens (five drafted + the bonus); plain decoding needs 150 ms for five tokens.
    assert theory.speculative_step_seconds(5, 0.003, 0.030) == pytest.approx(0.045)
    assert theory.speculative_step_seconds(0, 0.003, 0.030) == pytest.approx(0.030)  # plain decoding: one forward
    # The closed form agrees: c = 0.1, so a step costs 1.5 target forwards.
    assert theory.expected_speedup(1.0, 5, 0.1) == pytest.approx(6 / 1.5)


def test_weight_streaming_floor_of_a_70b_model():
    h100 = 3.35e12  # bytes/s of HBM3 on one H100 SXM (NVIDIA's datasheet)
    one_fp8 = theory.weight_streaming_seconds(70e9, 1, h100)
    two_bf16 = theory.weight_streaming_seconds(70e9, 2, h100, devices=2)
    assert one_fp8 == pytest.approx(two_bf16) == pytest.approx(70e9 / h100)
    assert 40 < 1 / one_fp8 < 80  # the 40-80 tokens/s a 70B model decodes at on H100s
    assert theory.weight_streaming_seconds(70e9, 2, h100, devices=4) == pytest.approx(two_bf16 / 2)
    with pytest.raises(ValueError, match="devices"):
        theory.weight_streaming_seconds(70e9, 2, h100, devices=0)
    with pytest.raises(ValueError, match="bandwidth"):
        theory.weight_streaming_seconds(70e9, 2, 0)


def test_arithmetic_operations_factor_matches_a_simulation():
    assert theory.arithmetic_operations_factor(0.7, 0, 0.1) == pytest.approx(1.0)  # plain decoding
    assert theory.arithmetic_operations_factor(1.0, 4, 0.0) == pytest.approx(1.0)  # every token kept, free drafts
    rng = random.Random(0)
    alpha, gamma, c_hat = 0.7, 4, 0.05
    operations = tokens = 0.0
    for _ in range(40_000):
        kept = 0
        while kept < gamma and rng.random() < alpha:
            kept += 1
        operations += gamma * c_hat + gamma + 1  # the draft over gamma tokens, the target over gamma + 1
        tokens += kept + 1
    assert operations / tokens == pytest.approx(theory.arithmetic_operations_factor(alpha, gamma, c_hat), rel=0.01)
    assert theory.arithmetic_operations_factor(0.5, 4, 0.05) > theory.arithmetic_operations_factor(0.9, 4, 0.05)


def test_costed_speedup_charges_the_measured_verification():
    # With free verification (r = 1) it is Leviathan et al.'s closed form; a dearer verification lowers it, and
    # by exactly the step's extra cost.
    assert theory.costed_speedup(0.8, 4, 0.1, 1.0) == pytest.approx(theory.expected_speedup(0.8, 4, 0.1))
    tau = theory.expected_tokens_per_step(0.8, 4)
    assert theory.costed_speedup(0.8, 4, 0.1, 1.5) == pytest.approx(tau / (4 * 0.1 + 1.5))
    with pytest.raises(ValueError, match="verify_ratio"):
        theory.costed_speedup(0.8, 4, 0.1, 0.5)
