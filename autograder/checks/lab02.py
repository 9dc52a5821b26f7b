"""Hidden checks of lab 2 (the decode loop): sampling the draft, temperature on both models, cache rollback,
losslessness of a step, stopping at EOS, and the tokens-per-step formula."""

from __future__ import annotations

import torch
from checks._common import close, require, total_variation

CONTEXT = [9, 30, 2, 51, 14, 33]


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of `model` at every position of `tokens`, without any cache (the ground truth)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


def bucketed(dist: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """`dist` restricted to the tokens `top` plus one bucket for the rest (a test with few samples)."""
    kept = dist[top]
    return torch.cat([kept, (1 - kept.sum()).reshape(1)])


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(full_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt):]


def draft_sampling_hidden(draft, draft_model, cache_class) -> None:
    """The drafted token is sampled from the q it reports (not taken greedily)."""
    temperature, n = 1.5, 300
    counts = torch.zeros(draft_model.config.vocab_size)
    q0 = None
    for seed in range(n):
        tokens, q = draft(draft_model, cache_class(config=draft_model.config), list(CONTEXT), 1, temperature,
                          torch.Generator().manual_seed(seed))
        q0 = q[0].float() if q0 is None else q0
        counts[tokens[0]] += 1
    top = q0.topk(4).indices
    distance = total_variation(bucketed(counts / n, top), bucketed(q0, top))
    require(distance < 0.12, f"at temperature {temperature}, the drafted tokens are not distributed as the q "
                             f"returned with them (total variation {distance:.2f} over {n} drafts)")


def draft_temperature_hidden(draft, draft_model, cache_class) -> None:
    """Each q row is the draft's distribution at the same temperature as the target's, at the right position."""
    temperature, k = 0.5, 3
    tokens, q = draft(draft_model, cache_class(config=draft_model.config), list(CONTEXT), k, temperature,
                      torch.Generator().manual_seed(0))
    logits = full_logits(draft_model, CONTEXT + tokens[:-1])[-k:]
    expected = torch.softmax(logits / temperature, dim=-1)
    require(close(q, expected, atol=1e-4), f"at temperature {temperature} the q rows are not softmax(draft "
                                           "logits / temperature) at the drafted positions")


def step_cache_hidden(speculative_step, start) -> None:
    """After every step both caches hold exactly what the invariants say, and greedy output is unchanged."""
    dec = start(list(CONTEXT), 0.0, 0)
    for step in range(8):
        speculative_step(dec, 3)
        length = len(dec.tokens)
        require(dec.target_cache.get_seq_length() == length - 1,
                f"after step {step + 1} the target cache holds {dec.target_cache.get_seq_length()} positions "
                f"but the decoder has {length} tokens (it must hold all but the last)")
        require(dec.draft_cache.get_seq_length() <= length,
                f"after step {step + 1} the draft cache holds rejected tokens")
    new = dec.tokens[len(CONTEXT):]
    require(new == greedy_reference(dec.target, CONTEXT, len(new)),
            "at temperature 0 the emitted tokens differ from plain greedy decoding of the target")


def step_lossless_hidden(speculative_step, start, target) -> None:
    """At temperature 0.5 the first token a step emits is distributed as the target's p at temperature 0.5."""
    temperature, n = 0.5, 300
    counts = torch.zeros(target.config.vocab_size)
    context = None
    for seed in range(n):
        dec = start(list(CONTEXT), 0.0, seed)  # greedy first token: every run starts from the same context
        dec.temperature = temperature
        context = list(dec.tokens)
        counts[speculative_step(dec, 2)[0]] += 1
    p = torch.softmax(full_logits(target, context)[-1] / temperature, dim=-1)
    top = p.topk(4).indices
    distance = total_variation(bucketed(counts / n, top), bucketed(p, top))
    require(distance < 0.12, f"the first token of a step is not distributed as the target at temperature "
                             f"{temperature} (total variation {distance:.2f} over {n} steps)")


def generate_eos_hidden(generate, target) -> None:
    """Exactly max_new_tokens tokens, and nothing after EOS."""
    reference = greedy_reference(target, CONTEXT, 24)
    new, _ = generate(list(CONTEXT), 9, k=4)
    require(list(new) == reference[:9], "generate(max_new_tokens=9) did not return the first 9 greedy tokens")
    # EOS = the last token of the reference that appears there for the first time (random models repeat).
    stop = max(i for i in range(24) if reference[i] not in reference[:i])
    new, _ = generate(list(CONTEXT), 24, k=4, eos=reference[stop])
    require(list(new) == reference[: stop + 1], "with an EOS token the output must stop right after it")


def formulas_hidden(expected_tokens_per_step, expected_speedup) -> None:
    """The bonus token counts, alpha = 1 is handled, and the cost model is k * c + 1."""
    require(abs(expected_tokens_per_step(0.5, 3) - 1.875) < 1e-6, "expected tokens per step at alpha=0.5, k=3")
    require(abs(expected_tokens_per_step(1.0, 4) - 5.0) < 1e-6, "expected tokens per step at alpha=1, k=4")
    require(abs(expected_speedup(0.8, 4, 0.1) - (1 - 0.8**5) / 0.2 / 1.4) < 1e-6, "expected speedup")
