"""The drafter interface: the one piece that differs between speculative decoding methods.

The decode loop owns the target model and its cache; a drafter only proposes tokens and keeps its own state
in step with what the target accepted. A drafter implements three calls:

- `start(state)`: once, before the first `propose`: after the target's prefill (the prompt and the first
  new token are in `state`), or, for a drafter with `drafts_from_prompt = True`, before it (the prompt only);
- `propose(state, max_tokens)`: a `Draft` of at most `max_tokens` candidate tokens;
- `commit(state, accepted)`: after verification, `state.tokens` already holds the new tokens; `accepted`
  says how many of the drafted ones survived, so the drafter can roll its own cache back.

Drafters that read the target's features (Medusa, EAGLE) set `needs_hidden_states = True` and find them
in `state.hidden_states`. Drafters that can draft from the prompt alone (a draft model, prompt lookup) set
`drafts_from_prompt = True`: their first draft is then verified in the prefill forward itself, which saves
one target forward per generation.

A draft is a chain (`Draft.parents is None`, the common case) or a tree of candidates (`parents` given, see
`specdec_lab.tree`); a tree draft may also carry extra rows that ride along in the same target forward
without being candidates (lookahead decoding's Jacobi window): see `Draft`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec_lab.sampling import SamplingConfig


class LayerRows(Sequence):
    """Every target layer's hidden states at some rows, each layer cut out only when a drafter reads it.

    layers: the forward's per-layer states (1, q, H), embeddings first; rows: which of the q positions (a slice,
    or a tensor of indices). The target returns all of its layers (17 for the zoo target) and a drafter reads one
    to three; cutting every layer at every step cost more of the loop's time outside the forwards than all the
    rest of its bookkeeping on a chain (a tree's rows are a gather, a copy per layer). Indexing works as on a
    tuple: `rows[-1]` is the final-normed top layer, (n, H).
    """

    def __init__(self, layers: Sequence[torch.Tensor], rows: slice | torch.Tensor):
        self.layers, self.rows = layers, rows
        self.cut: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        index = range(len(self))[index]  # negative indices count from the top; out of range raises IndexError
        if index not in self.cut:
            self.cut[index] = self.layers[index][0, self.rows]
        return self.cut[index]


@dataclass
class DecodeState:
    """What a drafter may read about the generation in progress.

    tokens: prompt plus every token emitted so far (the last one is not yet in the target's cache);
    prompt_length: how many of `tokens` are the prompt; sampling: the settings applied to p and q alike;
    generator: the run's random source; hidden_states: per target layer (embeddings first, final-norm
    output last), the hidden states of the positions the last target forward accepted (only for drafters
    with `needs_hidden_states`; for a tree draft, the rows of the root and then of the accepted path), indexed
    like a tuple (a `LayerRows`, which cuts a layer's rows out when it is read);
    accepted_path: after a tree draft, the accepted node indices (root's child first), else None;
    extra_logits: after a draft with extra rows, the target's logits at those rows (m, V), else None.
    """

    tokens: list[int]
    prompt_length: int
    sampling: SamplingConfig
    generator: torch.Generator
    device: torch.device
    target: torch.nn.Module
    hidden_states: Sequence[torch.Tensor] | None = None
    accepted_path: list[int] | None = None
    extra_logits: torch.Tensor | None = None


@dataclass
class Draft:
    """Candidate tokens for one verification step: a chain (the default) or a tree.

    tokens: the proposed ids (for a chain, in order); probs: for each token, the processed draft
    distribution q it was sampled from (shape (len(tokens), vocab)), or None for a deterministic draft such
    as an n-gram match. For a tree, probs[i] is the q node i was drawn from given its earlier siblings
    (see `verify.verify_tree_rejection`).

    parents: None for a chain; for a tree, (n,) each node's parent index (-1 = the root, i.e. the last
    committed token; parents before children), as in `specdec_lab.tree.DraftTree`. Greedy runs verify the
    tree with `verify_tree_greedy`, sampling runs with the lossless `verify_tree_rejection`.
    lossy_typical: None (lossless, the default), or (epsilon, delta) to verify a tree with Medusa's typical
    acceptance, which is LOSSY (`verify.verify_typical_lossy`); only set when the user asked for it.
    verification: how a sampling run verifies a chain: "token" (token by token, `verify.verify_rejection`,
    the default) or "block" (jointly, `verify.verify_block`: lossless too, and never fewer tokens kept in
    expectation). Greedy runs match argmaxes either way; trees ignore it.

    Extra rows (tree drafts only; lookahead decoding's Jacobi window): tokens that the target scores in the
    same forward but that are not candidates. extra_tokens: (m,) ids; extra_positions: (m,) their position
    offsets from the root (root = 0, a node at depth d sits at d); extra_mask: (m, n + 1 + m) bool, which
    of [root, node 0..n-1, extra 0..m-1] each extra row may attend to (the cached prefix is always visible;
    include the diagonal). Tree rows never see extra rows. The loop hands the target's logits at the extra
    rows to the drafter as `state.extra_logits` and drops their KV entries from the cache.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    info: dict = field(default_factory=dict)
    parents: torch.Tensor | None = None
    lossy_typical: tuple[float, float] | None = None
    verification: str = "token"
    extra_tokens: torch.Tensor | None = None
    extra_positions: torch.Tensor | None = None
    extra_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


VERIFICATIONS = ("token", "block")


def check_verification(verification: str) -> str:
    """Return `verification` if it names a chain rule ("token" or "block"), else raise ValueError."""
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS} (token-wise or block verification of a "
                         f"chain), got {verification!r}")
    return verification


class Drafter(ABC):
    """Base class of every proposer that plugs into `specdec_lab.generate`."""

    needs_hidden_states: bool = False
    drafts_from_prompt: bool = False  # True: propose before the target has seen the prompt (chain drafts only)

    def start(self, state: DecodeState) -> None:  # noqa: B027 - optional hook
        """Prepare for a new generation (default: nothing to prepare)."""

    @abstractmethod
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        """Return at most `max_tokens` candidate tokens that follow `state.tokens`."""

    def commit(self, state: DecodeState, accepted: int) -> None:  # noqa: B027 - optional hook
        """Forget the rejected part of the last draft (default: stateless drafter, nothing to forget)."""
