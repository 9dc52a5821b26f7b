"""Prompt-lookup decoding: draft by copying what followed an earlier occurrence of the latest n-gram.

No model at all. When the output repeats its input (editing code, quoting a document) the continuation of
a matching n-gram is a free, often long, draft. The draft is deterministic: q is one-hot.
"""

from __future__ import annotations

import torch

from specdec_lab.drafters.base import DecodeState, Draft, Drafter


def find_continuation(tokens: torch.Tensor, max_ngram: int, min_ngram: int, k: int) -> torch.Tensor:
    """The up-to-k tokens that followed the most recent earlier occurrence of the longest matching suffix.

    tokens: the context (1-D); max_ngram / min_ngram: longest and shortest suffix length to look up;
    k: how many following tokens to return. Empty when no suffix of those lengths occurred before.
    """
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        windows = tokens[:-1].unfold(0, n, 1)  # every earlier n-gram that has a token after it
        starts = (windows == suffix).all(dim=1).nonzero().flatten()
        if len(starts):
            begin = int(starts[-1]) + n
            return tokens[begin : begin + k]
    return tokens[:0]


class PromptLookupDrafter(Drafter):
    """Drafts k tokens by n-gram matching in the prompt and the text generated so far.

    max_ngram: longest suffix to match (longer = more reliable matches); k: most tokens drafted per step;
    min_ngram: shortest suffix still worth matching.
    """

    drafts_from_prompt = True

    def __init__(self, max_ngram: int = 3, k: int = 10, min_ngram: int = 1):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (tokens drafted per step) must be a positive integer, got {k!r}")
        if not (isinstance(max_ngram, int) and isinstance(min_ngram, int) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram!r}, max_ngram={max_ngram!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.k = k

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        context = torch.tensor(state.tokens)
        tokens = find_continuation(context, self.max_ngram, self.min_ngram, min(self.k, max_tokens))
        return Draft(tokens.to(state.device), probs=None)
