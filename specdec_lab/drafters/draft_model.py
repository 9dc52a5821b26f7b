"""Vanilla speculative decoding (Leviathan et al. 2023, Chen et al. 2023): a small model drafts k tokens.

The draft model samples its k tokens autoregressively under the same sampling settings as the target and
records each q it sampled from, so the target can run the lossless rejection rule.

Adaptive draft length (as transformers' assisted generation does with its confidence threshold): with
`min_confidence` set, drafting stops before a token whose q has its largest probability below the threshold,
so a step drafts between 1 and k tokens. Lossless: the stopping decision is a function of the draft's own
q (of the context and the earlier draft tokens), never of the target, and the chain rule is exact for a
draft of any length fixed that way.

Verification: `verification="block"` has sampling runs verify each drafted block jointly
(`specdec_lab.verify.verify_block`, Sun et al. 2025) instead of token by token; lossless either way.
"""

from __future__ import annotations

import torch

from specdec_lab.cache import new_cache, truncate
from specdec_lab.drafters.base import DecodeState, Draft, Drafter, check_verification
from specdec_lab.forward import forward
from specdec_lab.sampling import confidence, draw


class DraftModelDrafter(Drafter):
    """Drafts with a smaller causal LM that shares the target's tokenizer.

    draft_model: any Hugging Face causal LM with the target's vocabulary; k: tokens drafted per step (the
    most, with `min_confidence`); min_confidence: None (always k tokens) or a threshold in (0, 1): stop
    before a token whose largest draft probability is below it (at least one token is always drafted);
    verification: "token" (the default, `verify.verify_rejection`) or "block" (`verify.verify_block`) for
    sampling runs; greedy runs match argmaxes either way.
    """

    drafts_from_prompt = True

    def __init__(self, draft_model: torch.nn.Module, k: int = 4, min_confidence: float | None = None,
                 verification: str = "token"):
        self.verification = check_verification(verification)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (tokens drafted per step) must be a positive integer, got {k!r}")
        check_confidence(min_confidence)
        self.min_confidence = min_confidence
        self.model = draft_model
        self.k = k
        self.cache = None
        self.cached = 0  # how many of state.tokens the draft cache holds

    def start(self, state: DecodeState) -> None:
        target_vocab = state.target.config.vocab_size
        draft_vocab = self.model.config.vocab_size
        if target_vocab != draft_vocab:
            raise ValueError(
                f"draft and target have different vocabularies ({draft_vocab} vs {target_vocab} tokens); "
                "speculative decoding needs a draft model that uses the target's tokenizer"
            )
        self.cache = new_cache(self.model)
        self.cached = 0

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        k = min(self.k, max_tokens)
        feed = torch.tensor(state.tokens[self.cached :], device=state.device)
        tokens, probs = [], []
        for i in range(k):
            logits = forward(self.model, self.cache, feed, keep=1).logits[0, -1]
            self.cached += 1 if i else len(state.tokens) - self.cached
            if i and self.min_confidence is not None and confidence(logits, state.sampling) < self.min_confidence:
                break  # the draft is unsure of this token: verify what we have (decided from q alone)
            token, q = draw(logits, state.sampling, state.generator)
            if q is not None:
                probs.append(q)
            tokens.append(token)
            feed = token.reshape(1)
        # The cache holds the context plus every drafted token it was fed: tokens[:-1], or all of them after
        # an early stop (commit keeps the accepted ones either way).
        return Draft(torch.stack(tokens), torch.stack(probs) if probs else None, verification=self.verification)

    def commit(self, state: DecodeState, accepted: int) -> None:
        # Keep the cached draft tokens that the target accepted; everything after them is stale.
        context_length = len(state.tokens) - accepted - 1
        self.cached = min(self.cached, context_length + accepted)
        truncate(self.cache, self.cached)


def check_confidence(min_confidence: float | None) -> None:
    """Raise ValueError unless `min_confidence` is None or a probability threshold in (0, 1)."""
    if min_confidence is not None and not 0 < min_confidence < 1:
        raise ValueError(f"min_confidence must be None or lie in (0, 1), got {min_confidence!r}")
