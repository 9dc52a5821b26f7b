"""Drafters: n-gram lookup, the draft model's proposals and cache rollback, and the drafter interface."""

from __future__ import annotations

import pytest
import torch

from specdec_lab import Draft, Drafter, DraftModelDrafter, PromptLookupDrafter, generate
from specdec_lab.drafters.prompt_lookup import find_continuation


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens)


def test_lookup_copies_what_followed_the_longest_matching_suffix():
    #             0  1  2  3  4  5  6  7  8  9
    context = ids(5, 1, 2, 7, 9, 3, 1, 2, 8, 1, 2)
    # Suffix (1, 2) occurred at 1 and 6; the most recent earlier one (6) was followed by 8, 1, 2.
    assert find_continuation(context, max_ngram=2, min_ngram=1, k=3).tolist() == [8, 1, 2]
    # The length-3 suffix (8, 1, 2) has no earlier occurrence, so max_ngram=3 falls back to length 2.
    assert find_continuation(context, max_ngram=3, min_ngram=1, k=2).tolist() == [8, 1]


def test_lookup_prefers_a_longer_match_over_a_more_recent_shorter_one():
    context = ids(4, 2, 6, 6, 3, 2, 9, 4, 2)
    # (4, 2) matches at 0 (followed by 6); the last 2 alone matches more recently at 5 (followed by 9).
    assert find_continuation(context, max_ngram=2, min_ngram=1, k=1).tolist() == [6]
    assert find_continuation(context, max_ngram=1, min_ngram=1, k=1).tolist() == [9]


def test_lookup_without_a_match_drafts_nothing():
    assert find_continuation(ids(1, 2, 3, 4), max_ngram=3, min_ngram=1, k=5).tolist() == []
    assert find_continuation(ids(7), max_ngram=3, min_ngram=1, k=5).tolist() == []
    assert find_continuation(ids(1, 2, 9, 1, 2), max_ngram=3, min_ngram=3, k=5).tolist() == []


def test_lookup_draft_is_capped_by_k_and_by_the_budget(tiny_target):
    context = [1, 2, 3, 4, 5, 6, 1, 2]
    proposals = []

    class Recorder(PromptLookupDrafter):
        def propose(self, state, max_tokens):
            draft = super().propose(state, max_tokens)
            proposals.append((list(state.tokens), max_tokens, draft.tokens.tolist(), draft.probs))
            return draft

    generate(tiny_target, context, drafter=Recorder(max_ngram=2, k=3), max_new_tokens=6)
    assert proposals and any(draft for _, _, draft, _ in proposals)
    for tokens, budget, draft, probs in proposals:
        expected = find_continuation(torch.tensor(tokens), 2, 1, min(3, budget)).tolist()
        assert draft == expected and len(draft) <= min(3, budget) and probs is None


class RecordingDraftModel(DraftModelDrafter):
    """A draft-model drafter that remembers each context it drafted from and what it proposed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = []

    def propose(self, state, max_tokens):
        draft = super().propose(state, max_tokens)
        self.log.append((list(state.tokens), draft))
        return draft


@torch.no_grad()
def greedy_continuation(model, context: list[int], count: int) -> list[int]:
    """The model's greedy continuation, recomputed from scratch without any cache."""
    tokens = list(context)
    for _ in range(count):
        tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(context):]


def test_draft_model_proposals_match_a_fresh_run_after_every_rollback(tiny_target, tiny_draft, prompts):
    # If the draft cache were rolled back wrongly, later drafts would differ from a cache-free recomputation.
    drafter = RecordingDraftModel(tiny_draft, k=4)
    out = generate(tiny_target, prompts[0], drafter=drafter, max_new_tokens=30)
    assert len(drafter.log) >= 6 and out.stats.accepted < out.stats.drafted  # rollbacks did happen
    for context, draft in drafter.log:
        assert draft.tokens.tolist() == greedy_continuation(tiny_draft, context, len(draft)), context


def test_sampled_drafts_carry_the_processed_draft_distributions(tiny_target, tiny_draft, prompts):
    drafter = RecordingDraftModel(tiny_draft, k=3)
    generate(tiny_target, prompts[1], drafter=drafter, max_new_tokens=15, temperature=0.8, top_k=5, seed=3)
    for _, draft in drafter.log:
        assert draft.probs is not None and draft.probs.shape == (len(draft), 64)
        torch.testing.assert_close(draft.probs.sum(-1), torch.ones(len(draft)))
        assert ((draft.probs > 0).sum(-1) <= 5).all()  # top-k was applied to q as well
        assert (draft.probs[torch.arange(len(draft)), draft.tokens] > 0).all()  # each token came from its q


def test_a_drafter_is_reusable_across_generations(tiny_target, tiny_draft, prompts):
    drafter = DraftModelDrafter(tiny_draft, k=4)
    first = [generate(tiny_target, p, drafter=drafter, max_new_tokens=10).tokens for p in prompts[:3]]
    again = [generate(tiny_target, p, drafter=DraftModelDrafter(tiny_draft, k=4), max_new_tokens=10).tokens
             for p in prompts[:3]]
    assert first == again


def test_the_interface_is_small_enough_for_a_custom_drafter(tiny_target, prompts):
    class RepeatLast(Drafter):
        """Guesses that the last token repeats: a deterministic draft (q = one-hot)."""

        def __init__(self):
            self.started = 0
            self.commits = []

        def start(self, state):
            self.started += 1

        def propose(self, state, max_tokens):
            return Draft(torch.tensor([state.tokens[-1]] * min(2, max_tokens)))

        def commit(self, state, accepted):
            self.commits.append(accepted)

    drafter = RepeatLast()
    reference = generate(tiny_target, prompts[5], max_new_tokens=16).tokens
    out = generate(tiny_target, prompts[5], drafter=drafter, max_new_tokens=16)
    assert out.tokens == reference
    assert drafter.started == 1 and drafter.commits == out.stats.accepted_per_step
    sampled = generate(tiny_target, prompts[5], drafter=RepeatLast(), max_new_tokens=16, temperature=1.0, seed=0)
    assert len(sampled.tokens) == 16


def test_layer_rows_read_like_a_tuple_of_the_kept_rows_and_cut_only_the_layers_read():
    from specdec_lab.drafters.base import LayerRows

    layers = tuple(torch.arange(12.0).reshape(1, 6, 2) + 100 * i for i in range(4))
    rows = LayerRows(layers, slice(1, 3))
    assert len(rows) == 4 and torch.equal(rows[-1], layers[3][0, 1:3]) and torch.equal(rows[0], layers[0][0, 1:3])
    assert [t.shape for t in rows[1:3]] == [(2, 2), (2, 2)] and len(list(rows)) == 4
    assert set(rows.cut) == {0, 1, 2, 3}
    gathered = LayerRows(layers, torch.tensor([0, 4, 5]))
    assert torch.equal(gathered[2], layers[2][0, [0, 4, 5]]) and set(gathered.cut) == {2}  # only what was read
    with pytest.raises(IndexError):
        gathered[4]
