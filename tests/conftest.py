"""Shared fixtures: small random Llama models (built in memory or saved and loaded like real checkpoints).

Every model is seeded, so tests are deterministic. Threads are pinned to one so several test processes can
share the machine.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=UserWarning, module="transformers")


def make_llama(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
               max_positions: int = 256, num_heads: int = 2, eos_token_id: int | None = None,
               logit_scale: float = 1.0) -> LlamaForCausalLM:
    """A seeded random Llama in eval mode. `logit_scale` sharpens (>1) or flattens (<1) its distributions."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


@pytest.fixture(scope="session")
def llama_factory():
    """The `make_llama` builder, for tests that need their own shapes."""
    return make_llama


@pytest.fixture(scope="session")
def tiny_target():
    """A 2-layer random target with a 64-token vocabulary and sharp-ish distributions."""
    return make_llama(vocab_size=64, hidden_size=48, num_layers=2, seed=0, logit_scale=4.0)


@pytest.fixture(scope="session")
def tiny_draft():
    """A 1-layer random draft sharing the tiny target's vocabulary (mostly disagrees with it)."""
    return make_llama(vocab_size=64, hidden_size=32, num_layers=1, seed=1, logit_scale=4.0)


@pytest.fixture(scope="session")
def prompts():
    """20 seeded random prompts of 3..12 tokens over the tiny vocabulary."""
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, 64, (int(n),), generator=gen).tolist()
            for n in torch.randint(3, 13, (20,), generator=gen)]
