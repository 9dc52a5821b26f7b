"""Draft trees: structure, the Medusa sparse tree, and the one-forward tree attention on a real Llama.

The central check: for random trees, the logits every node gets from the single masked tree forward equal
the logits of running its root-to-node path sequentially (fp32, 1e-4); and after keeping the accepted path
the KV cache is the one sequential decoding would have built.
"""

from __future__ import annotations

import pytest
import torch

from specdec_lab.cache import keep_positions, new_cache
from specdec_lab.decode import tree_inputs, tree_step
from specdec_lab.drafters.base import DecodeState, Draft
from specdec_lab.sampling import SamplingConfig, make_generator
from specdec_lab.tree import DraftTree, additive_mask, choices_to_parents, expected_accepted, sparse_tree

#        root
#       /    \
#      0      1
#     / \     |
#    2   3    4
#    |
#    5
PARENTS = [-1, -1, 0, 0, 1, 2]


def random_tree(n: int, vocab: int, seed: int) -> DraftTree:
    """A random tree of n nodes: each node's parent is the root or any earlier node."""
    gen = torch.Generator().manual_seed(seed)
    parents = [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)]
    return DraftTree.from_parents(torch.randint(0, vocab, (n,), generator=gen), parents)


def test_structure_of_a_hand_built_tree():
    tree = DraftTree.from_parents(torch.arange(10, 16), PARENTS)
    assert tree.depths.tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.max_depth == 3
    assert tree.children() == [[0, 1], [2, 3], [4], [5], [], [], []]
    assert tree.path_to(5) == [0, 2, 5] and tree.path_to(-1) == []
    assert tree.paths() == [[0, 3], [1, 4], [0, 2, 5]]
    visible = tree.visibility().int()
    # slot 6 = node 5 sees the root, node 0, node 2 and itself.
    assert visible[6].tolist() == [1, 1, 0, 1, 0, 0, 1]
    assert visible[2].tolist() == [1, 0, 1, 0, 0, 0, 0]
    assert tree.position_ids(7).tolist() == [[7, 8, 8, 9, 9, 9, 10]]


def test_chain_is_a_causal_mask():
    tree = DraftTree.chain(torch.tensor([5, 6, 7]))
    assert tree.parents.tolist() == [-1, 0, 1] and tree.paths() == [[0, 1, 2]]
    mask = tree.attention_mask(past_length=2)
    assert mask.shape == (1, 1, 4, 6)
    assert torch.equal(mask[0, 0, :, :2], torch.zeros(4, 2))
    expected = torch.zeros(4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), torch.finfo(torch.float).min)
    assert torch.equal(mask[0, 0, :, 2:], expected)


def test_bad_parents_are_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match="parents must be -1"):
        DraftTree.from_parents(torch.tensor([1, 2]), [-1, 1])
    with pytest.raises(ValueError, match="one parent per token"):
        DraftTree.from_parents(torch.tensor([1, 2]), [-1])


def prefill(model, prefix: list[int]):
    cache = new_cache(model)
    model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_forward_matches_sequential_paths(llama_factory, seed):
    model = llama_factory(vocab_size=50, hidden_size=32, num_layers=2, seed=seed)
    tree = random_tree(12, 50, seed)
    prefix, root = [3, 14, 15, 9, 26], 5
    cache = prefill(model, prefix)
    feed, positions, visible = tree_inputs(tree, Draft(tree.tokens, parents=tree.parents), root, len(prefix))
    with torch.no_grad():
        logits = model(input_ids=feed[None], cache=cache, position_ids=positions, use_cache=True,
                       attention_mask=additive_mask(visible, len(prefix), torch.float32)).logits[0]
        for slot in range(len(tree) + 1):
            path = tree.tokens[tree.path_to(slot - 1)].tolist()
            sequential = model(input_ids=torch.tensor([prefix + [root] + path])).logits[0, -1]
            torch.testing.assert_close(logits[slot], sequential, atol=1e-4, rtol=0)


def test_keeping_the_accepted_path_leaves_the_sequential_cache(llama_factory):
    model = llama_factory(vocab_size=50, hidden_size=32, num_layers=2, seed=3)
    tree = DraftTree.from_parents(torch.tensor([7, 8, 9, 10, 11, 12]), PARENTS)
    prefix, root, path = [1, 2, 3, 4], 5, [1, 4]  # the path root -> node 1 -> node 4 is not contiguous
    cache = prefill(model, prefix)
    feed, positions, visible = tree_inputs(tree, Draft(tree.tokens, parents=tree.parents), root, len(prefix))
    with torch.no_grad():
        model(input_ids=feed[None], cache=cache, position_ids=positions, use_cache=True,
              attention_mask=additive_mask(visible, len(prefix), torch.float32))
        keep_positions(cache, len(prefix), torch.tensor([0] + [n + 1 for n in path]))
        reference = prefill(model, prefix + [root] + tree.tokens[path].tolist())
        for kept_layer, ref_layer in zip(cache.layers, reference.layers, strict=True):
            torch.testing.assert_close(kept_layer.keys, ref_layer.keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(kept_layer.values, ref_layer.values, atol=1e-5, rtol=0)


def test_extra_rows_are_scored_and_then_dropped(llama_factory):
    """Lookahead-style extra rows: they see what their mask says, tree rows never see them, the cache drops them."""
    model = llama_factory(vocab_size=50, hidden_size=32, num_layers=2, seed=4)
    prefix, root = [1, 2, 3, 4], 5
    nodes = torch.tensor([6, 7])  # a chain of two candidates
    extras = torch.tensor([30, 31])  # a second chain after the root, at offsets 1 and 2
    extra_mask = torch.tensor([[1, 0, 0, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.bool)
    draft = Draft(nodes, parents=torch.tensor([-1, 0]), extra_tokens=extras,
                  extra_positions=torch.tensor([1, 2]), extra_mask=extra_mask)
    state = DecodeState(prefix + [root], len(prefix), SamplingConfig(), make_generator(0), torch.device("cpu"), model)
    cache = prefill(model, prefix)
    with torch.no_grad():
        logits, verdict, emitted, _, depth = tree_step(model, draft, state, cache, want_hidden=False, max_depth=4)
        for i in range(2):
            along_extras = model(input_ids=torch.tensor([prefix + [root] + extras[: i + 1].tolist()])).logits[0, -1]
            torch.testing.assert_close(state.extra_logits[i], along_extras, atol=1e-4, rtol=0)
        along_nodes = model(input_ids=torch.tensor([prefix + [root] + nodes.tolist()])).logits[0, -3:]
        torch.testing.assert_close(logits, along_nodes, atol=1e-4, rtol=0)
    assert depth == 2 and cache.get_seq_length() == len(prefix) + 1 + verdict.accepted
    assert emitted == nodes[: verdict.accepted].tolist() + [int(along_nodes[verdict.accepted].argmax())]


def test_sparse_tree_adds_nodes_by_product_of_accuracies():
    accuracies = [[0.6, 0.2, 0.1], [0.4, 0.15, 0.05]]
    choices = sparse_tree(accuracies, budget=4)
    # Products: (0,) .6, (1,) .2, (0,0) .24, (0,1) .09, (2,) .1, (1,0) .08 -> the best four, breadth first.
    assert choices == [(0,), (1,), (2,), (0, 0)]
    assert choices_to_parents(choices) == [-1, -1, -1, 0]
    assert expected_accepted(choices, accuracies) == pytest.approx(1 + 0.6 + 0.2 + 0.24 + 0.1)
    assert sparse_tree(accuracies, budget=100) == sorted(
        [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)], key=lambda c: (len(c), c))


def test_sparse_tree_is_optimal_among_trees_of_its_size():
    """Greedy by product is optimal: no unchosen node whose parent is chosen beats a chosen leaf."""
    gen = torch.Generator().manual_seed(0)
    accuracies = (torch.rand(3, 4, generator=gen).sort(descending=True).values * 0.5).tolist()
    choices = sparse_tree(accuracies, budget=10)
    value = {c: expected_accepted([c], accuracies) - 1 for c in choices}
    chosen = set(choices)
    frontier = [c + (r,) for c in [()] + choices for r in range(4) if len(c) < 3 and c + (r,) not in chosen]
    leaves = [c for c in choices if not any(d[:-1] == c for d in choices)]
    assert min(value[c] for c in leaves) >= max(expected_accepted([c], accuracies) - 1 for c in frontier)
    assert all(c[:-1] in chosen for c in choices if len(c) > 1)


def test_sampled_tree_shape_is_closed_with_contiguous_ranks_and_alpha_trades_breadth_for_depth():
    from specdec_lab.tree import sampled_tree_shape

    for alpha in (0.3, 0.8):
        shape = sampled_tree_shape(12, depth=5, branching=3, alpha=alpha)
        assert len(shape) == 12 and max(map(len, shape)) <= 5 and max(c[-1] for c in shape) < 3
        present = set(shape)
        for choice in shape:  # parents and earlier siblings are always in the tree
            assert len(choice) == 1 or choice[:-1] in present
            assert choice[-1] == 0 or choice[:-1] + (choice[-1] - 1,) in present
    deep = sampled_tree_shape(12, 5, 3, 0.8)
    wide = sampled_tree_shape(12, 5, 3, 0.3)
    assert max(map(len, deep)) > max(map(len, wide))
    assert sum(len(c) == 1 for c in wide) > sum(len(c) == 1 for c in deep)
    with pytest.raises(ValueError, match="alpha"):
        sampled_tree_shape(4, 2, 2, 1.0)
