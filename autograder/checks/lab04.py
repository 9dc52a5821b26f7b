"""Hidden checks of lab 4 (EAGLE): the feature/token shift, autoregressive features, cumulative ranking,
renumbered parents, and the EAGLE-2 dynamic tree against an independent implementation."""

from __future__ import annotations

import torch
from checks._common import close, require


def pairs_hidden(eagle_training_pairs) -> None:
    """Feature i is paired with token i + 1 and trained towards feature i + 1."""
    features = torch.arange(12.0).reshape(6, 2)
    tokens = torch.tensor([10, 11, 12, 13, 14, 15])
    inputs, input_tokens, targets = eagle_training_pairs(features, tokens)
    require(close(inputs, features[:-1]), "the input features must be those of positions 0 .. n - 2")
    require(isinstance(input_tokens, torch.Tensor) and input_tokens.tolist() == [11, 12, 13, 14, 15],
            "the token paired with the feature at position i is the token at position i + 1")
    require(close(targets, features[1:]), "the target of the pair at position i is the feature at i + 1")


def chain_hidden(eagle_chain, head, logits_of) -> None:
    """The chain feeds back the predicted feature and the newly drafted token."""
    with torch.no_grad():
        for seed in range(3):
            feature = torch.randn(head.fc.in_features // 2, generator=torch.Generator().manual_seed(seed))
            token, expected, current = 5 + seed, [], feature
            for _ in range(5):
                current = head(current, token)
                token = int(logits_of(current).argmax())
                expected.append(token)
            got = eagle_chain(feature.clone(), 5 + seed, 5)
            require(list(got) == expected, "the drafted chain differs from rolling the head on its own features")


def select_hidden(select_nodes) -> None:
    """Ranking by score with index tie-break, and parents renumbered into the kept list."""
    parents = [-1, -1, 0, 0, 1, 2, 3]
    scores = [-0.2, -1.0, -0.5, -0.9, -1.5, -0.7, -2.0]
    kept, new_parents = select_nodes(parents, scores, 4)
    require(list(kept) == [0, 2, 3, 5], f"the 4 best nodes are [0, 2, 3, 5], got {list(kept)}")
    require(list(new_parents) == [-1, 0, 0, 1], "parents must be positions in the kept list")
    kept, _ = select_nodes([-1, -1], [-1.0, -1.0], 1)
    require(list(kept) == [0], "on a tie the lower index wins")


def reference_tree(head, logits_of, feature, token, depth, top_k, budget):
    features = {-1: head(feature, token)}
    frontier, tokens, parents, scores = [(-1, 0.0)], [], [], []
    for _ in range(depth):
        level = []
        for node, score in frontier:
            values, indices = torch.log_softmax(logits_of(features[node]), dim=-1).topk(top_k)
            for value, child in zip(values.tolist(), indices.tolist(), strict=True):
                tokens.append(child)
                parents.append(node)
                scores.append(score + value)
                level.append(len(tokens) - 1)
        frontier = [(i, scores[i]) for i in sorted(level, key=lambda i: (-scores[i], i))[:top_k]]
        for i, _ in frontier:
            features[i] = head(features[parents[i]], tokens[i])
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
    kept = sorted(order[:budget])
    position = {node: i for i, node in enumerate(kept)}
    return [tokens[i] for i in kept], [position[parents[i]] if parents[i] != -1 else -1 for i in kept]


def dynamic_tree_hidden(dynamic_tree, head, logits_of) -> None:
    """The same tree as EAGLE-2's expansion by cumulative path probability."""
    with torch.no_grad():
        for seed, (depth, top_k, budget) in enumerate([(4, 3, 8), (3, 2, 6)]):
            feature = torch.randn(head.fc.in_features // 2, generator=torch.Generator().manual_seed(10 + seed))
            expected = reference_tree(head, logits_of, feature, 4, depth, top_k, budget)
            got = dynamic_tree(feature.clone(), 4, depth=depth, top_k=top_k, budget=budget)
            require((list(got[0]), list(got[1])) == expected,
                    f"the tree for depth={depth}, top_k={top_k}, budget={budget} differs from EAGLE-2's expansion")
