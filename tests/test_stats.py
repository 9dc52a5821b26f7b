"""Decoding statistics: the Spec-Bench / vLLM conventions (tau counts the bonus token, AR decoding = 1.00)."""

from __future__ import annotations

import math

import pytest

from specdec_lab import DecodeStats, DraftModelDrafter, generate


def test_counters_and_derived_figures_on_a_hand_built_run():
    stats = DecodeStats(target_forwards=5)  # prefill + 4 verification steps
    for drafted, accepted in [(4, 2), (4, 4), (3, 0), (4, 1)]:
        stats.record_step(drafted, accepted)
    stats.new_tokens = 1 + (2 + 1) + (4 + 1) + (0 + 1) + (1 + 1)
    assert (stats.drafted, stats.accepted, stats.new_tokens) == (15, 7, 12)
    assert stats.mean_accepted_tokens == pytest.approx(12 / 5)
    assert stats.acceptance_rate == pytest.approx(7 / 15)
    assert stats.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 4, 1 / 3])  # survival from the start
    # Conditional: position 2 was reached by the 3 steps that kept position 1, and 2 of them kept it too.
    assert stats.conditional_acceptance == pytest.approx([3 / 4, 2 / 3, 1 / 2, 1 / 1])
    assert stats.accepted_histogram == {0: 1, 1: 1, 2: 1, 4: 1}
    summary = stats.summary()
    assert summary["tau"] == 2.4 and summary["acceptance_rate"] == 0.467
    assert summary["accepted_histogram"] == {0: 1, 1: 1, 2: 1, 4: 1}


def test_empty_stats_do_not_divide_by_zero():
    stats = DecodeStats()
    assert stats.mean_accepted_tokens == 0.0 and stats.acceptance_rate == 0.0
    assert stats.per_position_acceptance == [] and stats.conditional_acceptance == []
    assert stats.tokens_per_second == 0.0


def test_plain_autoregressive_decoding_has_tau_one(tiny_target, prompts):
    out = generate(tiny_target, prompts[0], max_new_tokens=10)
    stats = out.stats
    assert stats.target_forwards == stats.new_tokens == 10
    assert stats.mean_accepted_tokens == 1.0 and stats.summary()["tau"] == 1.0
    # Every forward is a step that drafted nothing, the prefill included.
    assert stats.drafted == 0 and stats.acceptance_rate == 0.0 and stats.accepted_histogram == {0: 10}


def test_a_known_run_with_draft_equal_to_target(tiny_target, prompts):
    # Greedy, draft = target, k = 4: every step, the prefill included, keeps 4 drafts + 1 bonus token; the
    # 21st token comes from a last step with no room left to draft.
    out = generate(tiny_target, prompts[0], drafter=DraftModelDrafter(tiny_target, k=4), max_new_tokens=21)
    stats = out.stats
    assert stats.target_forwards == 5 and stats.new_tokens == 21
    assert stats.mean_accepted_tokens == pytest.approx(4.2)  # without the bonus token a step would add 4, not 5
    assert (stats.drafted, stats.accepted, stats.acceptance_rate) == (16, 16, 1.0)
    assert stats.accepted_per_step == [4, 4, 4, 4, 0] and stats.accepted_histogram == {4: 4, 0: 1}
    assert stats.per_position_acceptance == [1.0, 1.0, 1.0, 1.0]


def test_stats_agree_with_the_steps_of_a_mixed_run(tiny_target, tiny_draft, prompts):
    steps = []
    out = generate(tiny_target, prompts[2], drafter=DraftModelDrafter(tiny_draft, k=3), max_new_tokens=40,
                   on_step=steps.append)
    stats = out.stats
    kept = [step.verdict.accepted for step in steps]
    assert stats.target_forwards == len(steps)  # the first draft rides in the prefill forward
    assert stats.new_tokens == len(out.tokens) == sum(len(step.emitted) for step in steps)
    assert stats.drafted == sum(len(step.draft) for step in steps) and stats.accepted == sum(kept)
    assert stats.accepted_per_step == kept and 0 < stats.acceptance_rate < 1  # some kept, some rejected
    for position, rate in enumerate(stats.per_position_acceptance):
        drafted = [step for step in steps if len(step.draft) > position]
        assert rate == pytest.approx(sum(step.verdict.accepted > position for step in drafted) / len(drafted))
        reached = [step for step in drafted if step.verdict.accepted >= position]
        expected = sum(step.verdict.accepted > position for step in reached) / len(reached) if reached else math.nan
        assert stats.conditional_acceptance[position] == pytest.approx(expected, nan_ok=True)
    assert stats.mean_accepted_tokens == pytest.approx(stats.new_tokens / stats.target_forwards)
    assert min(stats.draft_seconds, stats.verify_seconds, stats.other_seconds) >= 0
    assert stats.total_seconds >= stats.draft_seconds + stats.verify_seconds - 1e-6
    assert set(stats.summary()) >= {"new_tokens", "target_forwards", "drafted", "accepted", "tau",
                                    "acceptance_rate", "per_position_acceptance", "accepted_histogram",
                                    "draft_seconds", "verify_seconds", "other_seconds", "total_seconds"}


def test_the_forward_that_fed_the_prompt_is_timed_as_the_prefill(tiny_target, tiny_draft, prompts):
    """Plain decoding and a draft model feed the prompt in their first step; that step's verify time is the
    prefill (so per-step costs can leave it out). A drafter that needs the target's view of the prompt first
    (EAGLE) runs its own prefill forward, before any step."""
    from specdec_lab import EagleDrafter, EagleHead
    from specdec_lab.drafters.eagle import EagleConfig

    for drafter in (None, DraftModelDrafter(tiny_draft, k=3)):
        stats = generate(tiny_target, prompts[1], drafter=drafter, max_new_tokens=12).stats
        assert stats.prompt_steps == 1 and 0 < stats.prefill_seconds < stats.verify_seconds, stats
    head = EagleHead(EagleConfig.from_target(tiny_target)).attach(tiny_target).eval()
    stats = generate(tiny_target, prompts[1], drafter=EagleDrafter(head, mode="chain", depth=2),
                     max_new_tokens=12).stats
    assert stats.prompt_steps == 0 and stats.target_forwards == len(stats.accepted_per_step) + 1
    assert 0 < stats.prefill_seconds < stats.verify_seconds


def test_the_target_forwards_are_timed_apart_from_the_loop_around_them(tiny_target, tiny_draft, prompts):
    """forward_seconds holds the target's forward calls (chain, tree and prefill forwards alike), so that
    verify_seconds - forward_seconds is the loop's own cost: every forward made 20 ms slower must show up there
    in full, and nowhere outside verify_seconds."""
    import time

    from specdec_lab import EagleDrafter, EagleHead
    from specdec_lab.drafters.eagle import EagleConfig

    head = EagleHead(EagleConfig.from_target(tiny_target)).attach(tiny_target).eval()
    drafters = {"plain": None, "draft": DraftModelDrafter(tiny_draft, k=3),
                "eagle chain": EagleDrafter(head, mode="chain", depth=2),
                "eagle tree": EagleDrafter(head, mode="tree", depth=2, top_k=2, total_tokens=4)}
    slow = tiny_target.register_forward_pre_hook(lambda module, args: time.sleep(0.02))
    try:
        for name, drafter in drafters.items():
            stats = generate(tiny_target, prompts[1], drafter=drafter, max_new_tokens=8).stats
            assert stats.forward_seconds >= 0.02 * stats.target_forwards, name
            assert stats.forward_seconds <= stats.verify_seconds, name
            assert "forward_seconds" in stats.summary()
    finally:
        slow.remove()
