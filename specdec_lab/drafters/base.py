"""The drafter interface: the one piece that differs between speculative decoding methods.

The decode loop owns the target model and its cache; a drafter only proposes tokens and keeps its own state
in step with what the target accepted. A drafter implements three calls:

- `start(state)`: once, after the target's prefill (the prompt and the first new token are in `state`);
- `propose(state, max_tokens)`: a `Draft` of at most `max_tokens` candidate tokens;
- `commit(state, accepted)`: after verification, `state.tokens` already holds the new tokens; `accepted`
  says how many of the drafted ones survived, so the drafter can roll its own cache back.

Drafters that read the target's features (Medusa, EAGLE) set `needs_hidden_states = True` and find them
in `state.hidden_states`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from specdec_lab.sampling import SamplingConfig


@dataclass
class DecodeState:
    """What a drafter may read about the generation in progress.

    tokens: prompt plus every token emitted so far (the last one is not yet in the target's cache);
    prompt_length: how many of `tokens` are the prompt; sampling: the settings applied to p and q alike;
    generator: the run's random source; hidden_states: per target layer (embeddings first, final-norm
    output last), the hidden states of the positions the last target forward accepted (only for drafters
    with `needs_hidden_states`).
    """

    tokens: list[int]
    prompt_length: int
    sampling: SamplingConfig
    generator: torch.Generator
    device: torch.device
    target: torch.nn.Module
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class Draft:
    """Candidate tokens for one verification step.

    tokens: the proposed ids, in order; probs: for each token, the processed draft distribution q it was
    sampled from (shape (len(tokens), vocab)), or None for a deterministic draft such as an n-gram match.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(ABC):
    """Base class of every proposer that plugs into `specdec_lab.generate`."""

    needs_hidden_states: bool = False

    def start(self, state: DecodeState) -> None:  # noqa: B027 - optional hook
        """Prepare for a new generation (default: nothing to prepare)."""

    @abstractmethod
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        """Return at most `max_tokens` candidate tokens that follow `state.tokens`."""

    def commit(self, state: DecodeState, accepted: int) -> None:  # noqa: B027 - optional hook
        """Forget the rejected part of the last draft (default: stateless drafter, nothing to forget)."""
