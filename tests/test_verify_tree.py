"""Tree verification rules: greedy path matching, lossless multi-candidate rejection, LOSSY typical acceptance.

Losslessness is tested statistically: a small-vocabulary "model" (a fixed random distribution for every
context) scores a fixed tree shape whose nodes are drawn from draft distributions; the first two emitted
tokens must follow the target's joint distribution (chi-square), and two broken variants of the rule must
fail the same test (the test has power). Typical acceptance must fail it on a case built to show it.
"""

from __future__ import annotations

import functools

import pytest
import torch

import specdec_lab.verify as verify
from specdec_lab.tree import DraftTree
from specdec_lab.verify import verify_greedy, verify_tree_greedy, verify_tree_rejection, verify_typical_lossy

VOCAB = 5
#         root
#      /   |   \
#     0    1    2      <- drawn without replacement from Q_ROOT
#    / \   |
#   3   4  5           <- 3, 4 drawn without replacement from Q_NODE0; 5 is deterministic (token 2)
PARENTS = [-1, -1, -1, 0, 0, 1]


@functools.cache
def target_p(context: tuple[int, ...]) -> torch.Tensor:
    """The toy target's next-token distribution after `context` (a fixed random draw per context)."""
    gen = torch.Generator().manual_seed(hash(context) % (2**31))  # tuples of ints hash the same in every run
    return torch.softmax(2 * torch.randn(VOCAB, generator=gen), 0)


Q_ROOT = torch.tensor([0.5, 0.05, 0.3, 0.1, 0.05])
Q_NODE0 = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])


def without_replacement(q: torch.Tensor, count: int, gen: torch.Generator) -> tuple[list[int], list[torch.Tensor]]:
    """Draw `count` distinct tokens from q; return them and the distribution each one was drawn from."""
    tokens, dists, remaining = [], [], q.clone()
    for _ in range(count):
        dist = remaining / remaining.sum()
        token = int(torch.multinomial(dist, 1, generator=gen))
        tokens.append(token)
        dists.append(dist)
        remaining[token] = 0
    return tokens, dists


def draw_tree(gen: torch.Generator, conditioned_q: bool = True) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """One random draft of the fixed shape: (tree, target probs at the slots, draft probs per node).

    conditioned_q=False is a broken drafter: it reports the unconditioned q for siblings drawn without
    replacement.
    """
    top, top_q = without_replacement(Q_ROOT, 3, gen)
    below, below_q = without_replacement(Q_NODE0, 2, gen)
    tokens = torch.tensor(top + below + [2])
    q = top_q + below_q + [torch.nn.functional.one_hot(torch.tensor(2), VOCAB).float()]
    if not conditioned_q:
        q = [Q_ROOT] * 3 + [Q_NODE0] * 2 + q[5:]
    tree = DraftTree.from_parents(tokens, PARENTS)
    target = torch.stack([target_p(tuple(tokens[tree.path_to(slot - 1)].tolist())) for slot in range(7)])
    return tree, target, torch.stack(q)


def first_two_tokens(rule, trials: int, seed: int, conditioned_q: bool = True) -> torch.Tensor:
    """Counts (VOCAB, VOCAB) of the first two tokens emitted; a second token the step did not give is
    drawn from the target after the first, as the next decoding step would."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB, VOCAB)
    for _ in range(trials):
        tree, target, q = draw_tree(gen, conditioned_q)
        verdict = rule(tree, target, q, gen)
        emitted = tree.tokens[verdict.path].tolist() + [verdict.next_token]
        if len(emitted) == 1:
            emitted.append(int(torch.multinomial(target_p(tuple(emitted)), 1, generator=gen)))
        counts[emitted[0], emitted[1]] += 1
    return counts


def true_joint() -> torch.Tensor:
    return torch.stack([target_p(())[a] * target_p((a,)) for a in range(VOCAB)])


def test_multi_candidate_rejection_is_lossless(chi_square):
    counts = first_two_tokens(verify_tree_rejection, trials=6000, seed=0)
    assert chi_square(counts, true_joint()) > 1e-3
    # The test has power: a third of the trials already expose each of these two mistakes.
    with pytest.MonkeyPatch.context() as patch:  # forgetting to remove the rejected siblings' mass
        patch.setattr(verify, "residual_distribution", lambda p, q: p)
        assert chi_square(first_two_tokens(verify_tree_rejection, trials=2000, seed=1), true_joint()) < 1e-6
    # reporting the unconditioned q for siblings drawn without replacement
    broken = first_two_tokens(verify_tree_rejection, trials=2000, seed=2, conditioned_q=False)
    assert chi_square(broken, true_joint()) < 1e-6


def test_deterministic_children_are_lossless(chi_square):
    """q = None: every node is a deterministic proposal (one-hot q), as in lookahead's n-gram candidates."""
    counts = first_two_tokens(lambda tree, target, q, gen: verify_tree_rejection(tree, target, None, gen),
                              trials=3000, seed=3)
    assert chi_square(counts, true_joint()) > 1e-3


def test_greedy_tree_follows_the_argmax_branch():
    tree = DraftTree.from_parents(torch.tensor([4, 1, 3, 2, 0, 2]), PARENTS)
    logits = torch.full((7, VOCAB), -1.0)
    for slot, best in enumerate([1, 3, 2, 0, 0, 0, 4]):  # root wants 1 (node 1), node 1 wants 2 (node 5)
        logits[slot, best] = 1.0
    verdict = verify_tree_greedy(tree, logits)
    assert (verdict.path, verdict.accepted, verdict.next_token, verdict.resampled) == ([1, 5], 2, 4, False)
    logits[0] = torch.tensor([0.0, 0.0, 0.0, 0.0, 5.0])  # root wants 4: node 0, whose children both miss
    verdict = verify_tree_greedy(tree, logits)
    assert (verdict.path, verdict.next_token, verdict.resampled) == ([0], 3, True)


def test_greedy_tree_on_a_chain_equals_chain_verification():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        tokens = torch.randint(0, 3, (4,), generator=gen)
        logits = torch.randn(5, 3, generator=gen)
        chain, tree = verify_greedy(tokens, logits), verify_tree_greedy(DraftTree.chain(tokens), logits)
        assert (chain.accepted, chain.next_token, chain.resampled) == (tree.accepted, tree.next_token, tree.resampled)


def test_typical_acceptance_is_not_lossless(chi_square):
    """A plausible-but-unlikely candidate is always accepted: token 3 has p = 0.1 but is emitted every time."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    tree = DraftTree.from_parents(torch.tensor([3]), [-1])
    target = torch.stack([p, p])
    gen = torch.Generator().manual_seed(0)
    typical = torch.zeros(4)
    lossless = torch.zeros(4)
    for _ in range(2000):
        typical[first_token(verify_typical_lossy(tree, target, gen), tree)] += 1
        lossless[first_token(verify_tree_rejection(tree, target, None, gen), tree)] += 1
    assert typical[3] == 2000  # the target would emit it 10% of the time
    assert chi_square(typical, p) < 1e-12
    assert chi_square(lossless, p) > 1e-3


def first_token(verdict, tree: DraftTree) -> int:
    return int(tree.tokens[verdict.path[0]]) if verdict.path else verdict.next_token


def test_typical_acceptance_takes_the_longest_plausible_path():
    tree = DraftTree.from_parents(torch.tensor([0, 1, 2, 3, 1]), [-1, -1, 1, 2, 0])
    sharp = torch.tensor([0.97, 0.01, 0.01, 0.01])  # low entropy: only likely tokens pass (threshold 0.09)
    flat = torch.full((4,), 0.25)  # high entropy: threshold 0.3 * exp(-log 4) = 0.075, every token passes
    target = torch.stack([flat, sharp, flat, flat, torch.tensor([1.0, 0, 0, 0]), flat])
    verdict = verify_typical_lossy(tree, target, torch.Generator().manual_seed(0))
    # Node 0's child (token 1 under the sharp p) is implausible; the branch through node 1 goes three deep.
    assert verdict.path == [1, 2, 3] and verdict.next_token == 0
