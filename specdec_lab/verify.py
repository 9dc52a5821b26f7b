"""Verification rules: given the drafted tokens and the target's distributions, what do we keep?

Chain rules (one candidate per position):

- `verify_greedy`: keep the longest prefix that matches the target's argmax, then emit the target's argmax.
- `verify_rejection`: the lossless rule of Leviathan et al. / Chen et al. Accept draft token x_i with
  probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a sample from the residual
  norm(max(0, p_i - q_i)); if every token is accepted, emit a bonus token sampled from p_k.
  A deterministic draft (n-gram lookup) is the special case q_i = one-hot(x_i).
- `verify_block`: block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025): the same inputs, but the
  drafted block is judged jointly, from its last token backwards. Lossless as well, and in expectation it
  never keeps fewer draft tokens than `verify_rejection`.

Tree rules (a `DraftTree` of candidates below the root; the target scored every slot in one forward):

- `verify_tree_greedy`: follow, from the root, the child that equals the target's argmax; stop where none
  does. This is the longest root-to-leaf path that matches greedy decoding.
- `verify_tree_rejection`: lossless multi-candidate rejection (SpecInfer-style). At a node, try its
  children in order; child x drawn from q is accepted with probability min(1, p(x) / q(x)), where p is the
  target's distribution with the mass of the rejected siblings removed (after each rejection
  p <- norm(max(0, p - q))). An accepted child becomes the new node; if every child is rejected, emit a
  sample from what is left of p; at a leaf, emit a bonus token from the target's p there.
- `verify_typical_lossy`: Medusa's typical acceptance. LOSSY: accepts any child the target finds
  plausible enough, so the output is NOT distributed as the target's. Used only when asked for by name.

Every rule returns a `Verdict`: how many draft tokens survived and the one extra token the target adds;
tree rules return a `TreeVerdict`, which also names the accepted nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.sampling import sample
from specdec_lab.tree import DraftTree


@dataclass
class Verdict:
    """The outcome of verifying one draft.

    accepted: number of leading draft tokens kept; next_token: the token the target adds after them (the
    correction at the first rejection, or the bonus token when all were kept); resampled: True when
    next_token replaces a rejected draft token, False when it is a bonus token.
    """

    accepted: int
    next_token: int
    resampled: bool


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Greedy chain verification.

    draft_tokens: the k proposed ids; target_logits: the target's logits at the k + 1 positions (position i
    scores draft token i; position k gives the token after the whole draft).
    """
    best = target_logits.argmax(-1)
    k = len(draft_tokens)
    mismatches = (draft_tokens != best[:k]).nonzero()
    accepted = int(mismatches[0]) if len(mismatches) else k
    return Verdict(accepted, int(best[accepted]), resampled=accepted < k)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where the target wants more mass than the draft gave.

    Falls back to p when p and q coincide (the residual is then empty, and rejection had probability 0).
    """
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def verify_rejection(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Lossless rejection verification of a chain of k draft tokens.

    draft_tokens: the k proposed ids; target_probs: processed target distributions p at the k + 1 positions;
    draft_probs: processed draft distributions q at the k positions the draft tokens were sampled from, or
    None for a deterministic draft (q = one-hot of the proposed token); generator: source of randomness.
    """
    k = len(draft_tokens)
    positions = torch.arange(k, device=target_probs.device)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).to(target_probs.dtype)
    p_x = target_probs[positions, draft_tokens]
    q_x = draft_probs[positions, draft_tokens]
    u = torch.rand(k, generator=generator, device=target_probs.device)
    # u < p/q, written without the division so that q(x) = 0 never produces a NaN.
    rejected = (u * q_x >= p_x).nonzero()
    if len(rejected) == 0:
        return Verdict(k, int(sample(target_probs[k], generator)), resampled=False)
    n = int(rejected[0])
    residual = residual_distribution(target_probs[n], draft_probs[n])
    return Verdict(n, int(sample(residual, generator)), resampled=True)


def block_weights(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The block rule's forward pass: p_0 = 1 and p_i = min(p_{i-1} * p(x_i) / q(x_i), 1) for i = 1..k.

    p_x / q_x: (k,) the target's and the draft's probabilities of the k drafted tokens. Returns (k + 1,)
    float64 weights, p_0 first. p_i is the probability that block verification keeps at least the first i
    draft tokens, given those i tokens (see `verify_block`). A token with q(x) = 0 but p(x) > 0 has an infinite
    ratio (weight 1); one with p(x) = q(x) = 0 gets weight 0, as `verify_rejection` would reject it.
    """
    weights = [1.0]
    for p, q in zip(p_x.double().tolist(), q_x.double().tolist(), strict=True):
        ratio = p / q if q > 0 else (float("inf") if p > 0 else 0.0)
        weights.append(min(weights[-1] * ratio, 1.0) if weights[-1] > 0 else 0.0)  # never 0 * inf
    return torch.tensor(weights, dtype=torch.float64, device=p_x.device)


def block_residual(weight: float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The block rule's unnormalised residual after keeping i draft tokens: max(p_i * p - q, 0).

    weight: p_i from `block_weights`; p / q: the target's and the draft's distributions at position i + 1.
    At i = 0 (weight 1) this is the token-wise residual max(p - q, 0).
    """
    return (weight * p.double() - q.double()).clamp(min=0)


def block_stop_probabilities(weights: torch.Tensor, target_probs: torch.Tensor,
                             draft_probs: torch.Tensor) -> torch.Tensor:
    """h_0 .. h_k: the probability that the backward pass stops at i, given that it did not stop above i.

    h_k = p_k; for i < k, with B_i = sum_x max(p_i * p_{i+1}(x) - q_{i+1}(x), 0) (the residual mass),
    h_i = B_i / (B_i + 1 - p_i); h_0 = 1. weights: (k + 1,) from `block_weights`; target_probs: (k + 1, V);
    draft_probs: (k, V). A 0 / 0 (B_i = 0 and p_i = 1) is a level the pass never reaches; it is set to 1.
    """
    k = len(weights) - 1
    stop = torch.ones(k + 1, dtype=torch.float64, device=weights.device)
    stop[k] = weights[k]
    for i in range(1, k):
        mass = float(block_residual(float(weights[i]), target_probs[i], draft_probs[i]).sum())
        denominator = mass + 1.0 - float(weights[i])
        stop[i] = mass / denominator if denominator > 0 else 1.0
    return stop


def verify_block(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Block verification of a chain of k draft tokens (Sun, Mendlovic, Leviathan et al., ICLR 2025, Alg. 2).

    draft_tokens: the k proposed ids x_1..x_k; target_probs: processed target distributions p at the k + 1
    positions (row i scores x_{i+1}; row k follows the whole draft); draft_probs: processed draft distributions
    q at the k positions the tokens were sampled from, or None for a deterministic draft (q = one-hot);
    generator: source of randomness. The same inputs and verdict as `verify_rejection`.

        sample eta_1 .. eta_k ~ U(0, 1)
        p_0 = 1
        for i = 1 .. k:                                   # forward: one weight per kept prefix
            p_i = min(p_{i-1} * p(x_i) / q(x_i), 1)
            h_i = sum_x max(p_i p_{i+1}(x) - q_{i+1}(x), 0) / (same sum + 1 - p_i)     (h_k = p_k)
        for i = k, k - 1, .., 0:                          # backward: keep the longest prefix that passes
            if eta_i < h_i (h_0 = 1): tau = i; stop
        if tau = k: next token ~ p_{k+1}                  # the bonus token, as in token-wise verification
        else:       next token ~ norm(max(p_tau * p_{tau+1} - q_{tau+1}, 0))
        emit x_1 .. x_tau, next token

    Why it is lossless. Claim, for every i and every drafted prefix x_1..x_i: P(tau >= i | x_1..x_i) = p_i,
    and given tau >= i the tokens after x_1..x_i are distributed as the target's continuation. At i = 0 (p_0
    = 1) that is the whole statement. Induction from i = k down: at k, tau = k with probability p_k and the
    bonus token is drawn from p_{k+1}. At i < k, write p = p_{i+1}, q = q_{i+1} (both given x_1..x_i) and
    w = p_i. The next token y is x_{i+1} kept (tau >= i + 1) or the residual sample (tau = i):
      P(tau >= i + 1, x_{i+1} = y) = q(y) min(w p(y) / q(y), 1) = min(w p(y), q(y))     (induction)
      P(tau < i + 1) = sum_y max(q(y) - w p(y), 0) = B + 1 - w,   B = sum_y max(w p(y) - q(y), 0)
      P(tau = i, y) = (B + 1 - w) * h_i * max(w p(y) - q(y), 0) / B = max(w p(y) - q(y), 0)
    (eta_i is independent of the levels above, and h_i depends on x_1..x_i only). The two add up to
    min(w p(y), q(y)) + max(w p(y) - q(y), 0) = w p(y): tau >= i with probability w, and then y ~ p. After
    y the continuation is the target's: by induction when x_{i+1} was kept, by the next decoding step when y
    was the residual sample.

    Why it never keeps fewer tokens in expectation than token-wise verification. E[tau] = sum_i P(tau >= i)
    for both rules. Token-wise, P(tau >= i | x_1..x_i) = prod_{j <= i} min(1, r_j) with r_j = p_j(x_j) / q_j(x_j).
    Block-wise it is p_i = min(p_{i-1} r_i, 1) >= p_{i-1} min(r_i, 1) (as p_{i-1} <= 1), so by induction
    p_i >= prod_{j <= i} min(1, r_j) for every drafted prefix: each prefix survives at least as often, and
    E[tau] is at least token-wise's (the paper proves it is the best any valid verifier can do with these
    inputs). A low ratio early in the block is no longer final: a later token the target likes more than the
    draft did (r > 1) raises the weight back. Note that the inequality holds given each drafted *prefix*, not
    given the whole block: a block whose later tokens the target dislikes can keep fewer tokens than token-wise
    would on that block, and is paid back on the blocks it likes.

    Greedy runs (p and q one-hot) reduce to greedy matching: p_i = 1 while the tokens match the argmax and
    0 from the first mismatch; the decode loop calls `verify_greedy` there.
    """
    k = len(draft_tokens)
    positions = torch.arange(k, device=target_probs.device)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).to(target_probs.dtype)
    eta = torch.rand(k, generator=generator, device=target_probs.device).double().cpu()
    weights = block_weights(target_probs[positions, draft_tokens], draft_probs[positions, draft_tokens])
    stop = block_stop_probabilities(weights, target_probs, draft_probs)
    kept = next((i for i in range(k, 0, -1) if eta[i - 1] < stop[i]), 0)
    if kept == k:
        return Verdict(k, int(sample(target_probs[k], generator)), resampled=False)
    residual = block_residual(float(weights[kept]), target_probs[kept], draft_probs[kept])
    if residual.sum() <= 0:  # only at a level reached with probability 0 (rounding): fall back to p, as
        # `residual_distribution` does
        residual = target_probs[kept].double()
    return Verdict(kept, int(sample(residual.to(target_probs.dtype), generator)), resampled=True)


# --- Trees ----------------------------------------------------------------------------------------------------
# Slot convention (as in tree.py): row 0 of the target's outputs belongs to the root, row i + 1 to node i.


@dataclass
class TreeVerdict(Verdict):
    """The outcome of verifying a draft tree: a `Verdict` plus the accepted root-to-node path.

    path: the accepted node indices, root's child first (`accepted == len(path)`); next_token follows the
    last of them (or the root when the path is empty).
    """

    path: list[int]


def verify_tree_greedy(tree: DraftTree, target_logits: torch.Tensor) -> TreeVerdict:
    """Greedy tree verification: the longest root-to-leaf path whose tokens are the target's argmax.

    tree: the candidates; target_logits: (n + 1, V) the target's logits at the slots (root first).
    """
    best = target_logits.argmax(-1).tolist()
    tokens = tree.tokens.tolist()
    kids = tree.children()
    path: list[int] = []
    node = -1
    while True:
        want = best[node + 1]
        match = next((child for child in kids[node + 1] if tokens[child] == want), None)
        if match is None:
            return TreeVerdict(len(path), want, bool(kids[node + 1]), path)
        path.append(match)
        node = match


def verify_tree_rejection(
    tree: DraftTree,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> TreeVerdict:
    """Lossless multi-candidate rejection verification of a draft tree (SpecInfer-style).

    tree: the candidates; target_probs: (n + 1, V) the processed target distributions p at the slots (root
    first); draft_probs: (n, V) for each node, the distribution q it was drawn from *given its earlier
    siblings* (for siblings drawn without replacement, q with the earlier siblings' tokens removed and
    renormalised; for i.i.d. siblings, the same q), or None when every node is deterministic
    (q = one-hot of its token); generator: source of randomness.

    Why it is lossless: at a node, child j is accepted with probability min(1, p_j(x) / q_j(x)) and
    otherwise the rule continues with p_{j+1} = norm(max(0, p_j - q_j)), a function of the history only. By
    induction from the last child (after which a token is drawn from the residual), the emitted token is
    distributed as p_j given any history; at j = 1 that is the target's p at the node. The same argument
    then applies one level down, at the accepted child.
    """
    tokens = tree.tokens.tolist()
    kids = tree.children()
    path: list[int] = []
    node = -1
    while True:
        p = target_probs[node + 1]
        children = kids[node + 1]
        if not children:
            return TreeVerdict(len(path), int(sample(p, generator)), False, path)
        u = torch.rand(len(children), generator=generator, device=p.device)
        accepted_child = None
        for child, u_child in zip(children, u, strict=True):
            x = tokens[child]
            q = draft_probs[child] if draft_probs is not None else None
            q_x = q[x] if q is not None else 1.0
            if u_child * q_x < p[x]:  # u < p(x) / q(x), without dividing by a possible q(x) = 0
                accepted_child = child
                break
            if q is None:
                q = torch.nn.functional.one_hot(tree.tokens[child], p.shape[-1]).to(p.dtype)
            p = residual_distribution(p, q)
        if accepted_child is None:
            return TreeVerdict(len(path), int(sample(p, generator)), True, path)
        path.append(accepted_child)
        node = accepted_child


def verify_typical_lossy(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    epsilon: float = 0.09,
    delta: float = 0.3,
) -> TreeVerdict:
    """Medusa's typical acceptance. LOSSY: the output is NOT distributed as the target's distribution.

    A node's token x is plausible when p(x) > min(epsilon, delta * exp(-H(p))), p being the target's
    processed distribution at the node's parent and H its entropy: flat distributions accept more. The
    longest root-to-leaf prefix of plausible tokens is kept (the first such path on ties), then the next
    token is sampled from p at its end. At temperature 0 (p one-hot) this is greedy verification.

    tree: the candidates; target_probs: (n + 1, V) processed target distributions at the slots (root first);
    generator: randomness for the final token; epsilon: hard probability threshold; delta: entropy-scaled
    threshold factor (the paper's defaults: 0.09 and 0.3).
    """
    entropy = -(target_probs * target_probs.clamp_min(1e-30).log()).sum(-1)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    parent_slots = tree.parents + 1
    plausible = (target_probs[parent_slots, tree.tokens] > threshold[parent_slots]).tolist()
    best: list[int] = []
    for path in tree.paths():
        kept = 0
        while kept < len(path) and plausible[path[kept]]:
            kept += 1
        if kept > len(best):
            best = path[:kept]
    end = best[-1] + 1 if best else 0
    has_children = bool(tree.children()[end])
    return TreeVerdict(len(best), int(sample(target_probs[end], generator)), has_children, best)
