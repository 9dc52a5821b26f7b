"""Medusa (Cai et al. 2024): extra decoding heads on the target's last hidden state draft a tree of tokens.

The target's own lm_head, applied to its final hidden state h_t, predicts token t + 1 (the root of the next
draft, already sampled by the loop). Medusa adds K small heads on the same h_t: head k (k = 1..K) predicts
token t + 1 + k. In the paper each Medusa-1 head is a residual block followed by its own trained projection onto
the vocabulary (initialised from the lm_head). This course simplifies: the heads train only the residual block and
share the target's frozen lm_head:

    logits_k = lm_head(h + SiLU(W_k h + b_k))       # the paper: W2_k (h + SiLU(W1_k h + b_k)), W2_k per head

With W_k = 0 at initialisation every head starts as a copy of the target's next-token prediction. The
heads' top choices form a tree (depth k holds head k's candidates, `specdec_lab.tree.sparse_tree` picks
which combinations are worth verifying) that the target checks in one forward.

Verification: greedy at temperature 0; lossless multi-candidate rejection when sampling (children are
sampled from the head's processed distribution q without replacement, and each node carries the q it was
drawn from given its earlier siblings); or, only if asked for with `acceptance="typical"`, the paper's
typical acceptance, which is LOSSY (faster, but the output is no longer the target's distribution).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec_lab.drafters.base import DecodeState, Draft, Drafter
from specdec_lab.sampling import process_logits, sample_without_replacement
from specdec_lab.tree import choices_to_parents

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class MedusaHeads(torch.nn.Module):
    """K Medusa-1 heads: residual SiLU blocks on the target's final (normed) hidden state.

    hidden_size: the target's hidden size; num_heads: K, how many tokens beyond the next one are predicted;
    tree: optional default draft tree (choice-tuples, see `specdec_lab.tree.sparse_tree`) stored with the
    heads; card: optional measured figures saved in config.json (e.g. per-head accuracy).
    """

    def __init__(self, hidden_size: int, num_heads: int, tree: list[tuple[int, ...]] | None = None,
                 card: dict | None = None):
        super().__init__()
        if num_heads < 1 or hidden_size < 1:
            raise ValueError(f"Medusa needs at least one head and a positive hidden size, got "
                             f"num_heads={num_heads}, hidden_size={hidden_size}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.tree = [tuple(c) for c in tree] if tree is not None else None
        self.card = dict(card or {})
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for block in self.blocks:  # the paper's init: each head starts as the target's own next-token head
            torch.nn.init.zeros_(block.weight)
            torch.nn.init.zeros_(block.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-head features (..., K, hidden) of final hidden states `hidden` (..., hidden)."""
        return torch.stack([hidden + torch.nn.functional.silu(block(hidden)) for block in self.blocks], dim=-2)

    def logits(self, hidden: torch.Tensor, lm_head: torch.nn.Module) -> torch.Tensor:
        """Per-head token logits (..., K, V): head k's guess at the token k + 1 positions after the next one."""
        return lm_head(self(hidden))

    def save(self, folder: str | Path) -> None:
        """Write config.json and fp16 model.safetensors (a small Hugging Face-style folder)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"model_type": "medusa_heads", "architecture": "Medusa-1 residual SiLU heads on the target lm_head",
                  "hidden_size": self.hidden_size, "medusa_num_heads": self.num_heads,
                  "tree": [list(c) for c in self.tree] if self.tree is not None else None, "card": self.card}
        (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME))

    @classmethod
    def load(cls, folder: str | Path, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32) -> MedusaHeads:
        """Load heads saved by `save` (fp16 on disk, upcast to `dtype` on `device`), in eval mode."""
        folder = Path(folder)
        if not (folder / CONFIG_NAME).exists() or not (folder / WEIGHTS_NAME).exists():
            raise FileNotFoundError(f"no Medusa heads in {folder}: expected {CONFIG_NAME} and {WEIGHTS_NAME} "
                                    "(train them with `specdec train medusa`)")
        config = json.loads((folder / CONFIG_NAME).read_text())
        heads = cls(config["hidden_size"], config["medusa_num_heads"], config.get("tree"), config.get("card"))
        heads.load_state_dict({k: v.float() for k, v in load_file(str(folder / WEIGHTS_NAME)).items()})
        return heads.to(device=device, dtype=dtype).eval()


class MedusaDrafter(Drafter):
    """Drafts a tree (or chain) of tokens from Medusa heads; plugs into `generate` like any drafter.

    heads: trained `MedusaHeads` for the target; tree: the tree shape as choice-tuples ((0,) = head 1's top
    token, (0, 1) = head 2's second choice below it, ...), "chain" for head k's top token at depth k, or
    None for the tree saved with the heads (a chain if none was saved); acceptance: "rejection" (lossless:
    greedy at temperature 0, multi-candidate rejection when sampling) or "typical" (Medusa's typical
    acceptance, LOSSY when sampling: the output is not distributed as the target's); typical_epsilon /
    typical_delta: the typical-acceptance thresholds (the paper's defaults).
    """

    needs_hidden_states = True

    def __init__(self, heads: MedusaHeads, tree: list[tuple[int, ...]] | str | None = None,
                 acceptance: str = "rejection", typical_epsilon: float = 0.09, typical_delta: float = 0.3):
        if acceptance not in ("rejection", "typical"):
            raise ValueError(f"acceptance must be 'rejection' (lossless) or 'typical' (lossy), got {acceptance!r}")
        tree = heads.tree if tree is None else tree
        if tree is None or tree == "chain":
            tree = [(0,) * depth for depth in range(1, heads.num_heads + 1)]
        if isinstance(tree, str):
            raise ValueError(f"tree must be a list of choice-tuples, 'chain' or None, got {tree!r}")
        tree = [tuple(int(r) for r in choice) for choice in tree]
        too_deep = [c for c in tree if not 1 <= len(c) <= heads.num_heads]
        if too_deep or any(r < 0 for c in tree for r in c):
            raise ValueError(f"tree choices must have 1..{heads.num_heads} non-negative ranks (one per head), "
                             f"got {too_deep[:3] or tree[:3]}")
        self.heads = heads
        self.choices = sorted(set(tree), key=lambda c: (len(c), c))
        choices_to_parents(self.choices)  # checks that every node's parent is in the tree
        self.acceptance = acceptance
        self.typical = (typical_epsilon, typical_delta)
        self.lm_head: torch.nn.Module | None = None
        self._shapes: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}

    @classmethod
    def from_pretrained(cls, folder: str | Path, target: torch.nn.Module | None = None, **kwargs) -> MedusaDrafter:
        """A drafter from heads saved in `folder` (placed like `target`'s weights); kwargs as for the class."""
        weights = next(target.parameters()) if target is not None else torch.empty(0)
        return cls(MedusaHeads.load(folder, weights.device, weights.dtype), **kwargs)

    @property
    def lossless(self) -> bool:
        """False when typical acceptance (lossy) is in use."""
        return self.acceptance == "rejection"

    def start(self, state: DecodeState) -> None:
        target_hidden = state.target.config.hidden_size
        if target_hidden != self.heads.hidden_size:
            raise ValueError(f"these Medusa heads were trained for hidden size {self.heads.hidden_size}, "
                             f"but the target's hidden size is {target_hidden}: use the target's own heads")
        self.lm_head = state.target.get_output_embeddings()
        self.heads.to(device=state.device, dtype=self.lm_head.weight.dtype)

    def tree_shape(self, limits: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """(parents, head index, rank) tensors of the nodes whose rank at each depth is below `limits`.

        limits: per head, how many candidates are available (the tree's depth is cut where a limit is 0).
        """
        if limits not in self._shapes:
            kept = [c for c in self.choices if all(r < limits[k] for k, r in enumerate(c))]
            parents = torch.tensor(choices_to_parents(kept), dtype=torch.long)
            heads = torch.tensor([len(c) - 1 for c in kept], dtype=torch.long)
            ranks = torch.tensor([c[-1] for c in kept], dtype=torch.long)
            self._shapes[limits] = (parents, heads, ranks)
        return self._shapes[limits]

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        hidden = state.hidden_states[-1][-1]  # final-normed hidden state of the last accepted position
        logits = self.heads.logits(hidden, self.lm_head).float()  # (K, V)
        wanted = [0] * self.heads.num_heads  # candidates needed per head
        for choice in self.choices:
            wanted[len(choice) - 1] = max(wanted[len(choice) - 1], choice[-1] + 1)
        # Heads deeper than the tree offer no candidates: never draw from them (a tree may be shallower than K).
        depth = min(max(len(choice) for choice in self.choices), max_tokens)
        if state.sampling.greedy or self.acceptance == "typical":
            candidates, probs = self.top_candidates(logits, wanted, depth)
        else:
            candidates, probs = self.sampled_candidates(logits, wanted, depth, state)
        limits = tuple(len(c) for c in candidates) + (0,) * (self.heads.num_heads - len(candidates))
        parents, head, rank = self.tree_shape(limits)
        table = torch.stack([torch.nn.functional.pad(c, (0, max(wanted) - len(c))) for c in candidates])
        tokens = table[head.to(table.device), rank.to(table.device)] if len(parents) else table.new_empty(0)
        node_probs = torch.stack([probs[h][r] for h, r in zip(head.tolist(), rank.tolist(), strict=True)]) \
            if probs is not None and len(parents) else None
        info = {"head_logits": logits, "depth": int(head.max()) + 1 if len(head) else 0}
        return Draft(tokens, node_probs, info=info, parents=parents.to(tokens.device),
                     lossy_typical=self.typical if self.acceptance == "typical" else None)

    @staticmethod
    def top_candidates(logits: torch.Tensor, wanted: list[int], depth: int):
        """Deterministic candidates: each head's `wanted` most likely tokens (no q: greedy / typical)."""
        return [logits[k].topk(wanted[k]).indices for k in range(depth)], None

    @staticmethod
    def sampled_candidates(logits: torch.Tensor, wanted: list[int], depth: int, state: DecodeState):
        """Candidates sampled without replacement from each head's processed distribution q.

        Returns per head the sampled tokens and, for the r-th of them, q with the first r samples removed and
        renormalised: the distribution it was drawn from given its earlier siblings, which the lossless tree
        rule needs. A head whose q has fewer tokens than wanted (top-k / top-p) offers only those.

        Why the tree stays lossless: how many candidates each head draws is fixed by the tree shape before
        any is drawn, and no drawn candidate is dropped for its own probability (a node is left out only by
        its rank, a position fixed in advance), so each node really was drawn from the conditional q it
        carries, which is all `verify.verify_tree_rejection` asks. A rank left out in the middle (a shape
        with (0,), (2,) but not (1,)) is harmless: the skipped draw is part of the history the later
        sibling's conditional q is computed from.
        """
        candidates, probs = [], []
        for k in range(depth):
            q = process_logits(logits[k], state.sampling)
            drawn, conditional = sample_without_replacement(q, wanted[k], state.generator)
            candidates.append(drawn)
            probs.append(conditional)
        return candidates, probs
