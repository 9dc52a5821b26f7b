"""Medusa heads and drafter in the one decode loop: greedy equality, lossless sampling, typical is lossy.

Random heads on a tiny random target are enough for the correctness contract (equality and losslessness
hold for any heads); the shipped zoo heads are checked on held-out prompts as well.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import specdec_lab as sd
from specdec_lab.drafters.medusa import MedusaDrafter, MedusaHeads
from specdec_lab.models import zoo_path
from specdec_lab.sampling import SamplingConfig, process_logits
from specdec_lab.tree import sparse_tree

TREE = sparse_tree([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.2, 0.1]], budget=12)


def random_heads(hidden_size: int, num_heads: int, std: float, seed: int) -> MedusaHeads:
    heads = MedusaHeads(hidden_size, num_heads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.copy_(std * torch.randn(block.weight.shape, generator=gen))
    return heads.eval()


def assert_same_or_near_tie(target, prompt: list[int], ours: list[int], plain: list[int]) -> None:
    """Equal to plain greedy decoding, except where the target's top-2 logits are within 1e-4 (a numeric tie)."""
    if ours == plain:
        return
    first = next(i for i, (a, b) in enumerate(zip(ours, plain, strict=False)) if a != b)
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([prompt + plain[:first]])).logits[0, -1]
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) < 1e-4, f"diverged from plain greedy at token {first} without a near-tie"


@pytest.mark.parametrize("tree", [TREE, "chain"], ids=["sparse-tree", "chain"])
def test_greedy_medusa_equals_plain_decoding(tiny_target, prompts, tree):
    drafter = MedusaDrafter(random_heads(48, 3, std=0.05, seed=0), tree=tree)
    non_contiguous = 0
    for prompt in prompts:
        steps = []
        plain = sd.generate(tiny_target, prompt, max_new_tokens=40)
        out = sd.generate(tiny_target, prompt, drafter=drafter, max_new_tokens=40, on_step=steps.append)
        assert_same_or_near_tie(tiny_target, prompt, out.tokens, plain.tokens)
        assert out.stats.target_forwards < plain.stats.target_forwards
        paths = [s.verdict.path for s in steps if getattr(s.verdict, "path", None)]
        non_contiguous += sum(path[-1] != len(path) - 1 for path in paths)
    if tree is TREE:  # the test exercised the cache's path selection, not only prefix crops
        assert non_contiguous > 10


def test_typical_acceptance_at_temperature_zero_is_greedy(tiny_target, prompts):
    drafter = MedusaDrafter(random_heads(48, 3, std=0.05, seed=0), tree=TREE, acceptance="typical")
    for prompt in prompts[:5]:
        plain = sd.generate(tiny_target, prompt, max_new_tokens=30)
        assert sd.generate(tiny_target, prompt, drafter=drafter, max_new_tokens=30).tokens == plain.tokens


def exact_joint_of_tokens_2_and_3(model, prompt: list[int], config: SamplingConfig) -> torch.Tensor:
    """P(second, third new token) under target-only sampling, by enumerating every 3-token continuation."""
    vocab = model.config.vocab_size
    pairs = torch.tensor(list(itertools.product(range(vocab), repeat=2)))
    with torch.no_grad():
        p1 = process_logits(model(torch.tensor([prompt])).logits[0, -1], config)
        p2 = process_logits(model(torch.cat([torch.tensor(prompt).repeat(vocab, 1),
                                             torch.arange(vocab)[:, None]], 1)).logits[:, -1], config)
        p3 = process_logits(model(torch.cat([torch.tensor(prompt).repeat(vocab**2, 1), pairs], 1)).logits[:, -1],
                            config).reshape(vocab, vocab, vocab)
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


def sample_tokens_2_and_3(model, drafter, prompt, runs: int, sampling: dict) -> torch.Tensor:
    vocab = model.config.vocab_size
    counts = torch.zeros(vocab, vocab)
    for seed in range(runs):
        out = sd.generate(model, prompt, drafter=drafter, max_new_tokens=3, seed=seed, **sampling)
        counts[out.tokens[1], out.tokens[2]] += 1
    return counts


class DroppingUnlikelyCandidates(MedusaDrafter):
    """BROKEN on purpose: samples each head's candidates, then drops those that q finds much less likely
    than its favourite token, while each kept node still claims its conditional q."""

    def sampled_candidates(self, logits, wanted, depth, state):
        candidates, probs = super().sampled_candidates(logits, wanted, depth, state)
        for k in range(depth):
            q = process_logits(logits[k], state.sampling)
            keep = [r for r, token in enumerate(candidates[k].tolist()) if q[token] >= 0.8 * q.max()]
            candidates[k], probs[k] = candidates[k][keep], probs[k][keep]
        return candidates, probs


SAMPLINGS = {"T=1": {"temperature": 1.0}, "T=0.7,top-k=3": {"temperature": 0.7, "top_k": 3}}


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_medusa_sampling_is_lossless_and_broken_variants_are_not(llama_factory, chi_square, sampling):
    """Sampled trees (4 children wanted at depth 1; under top-k = 3 only 3 tokens in q) through `generate`;
    typical acceptance and a tree that drops candidates by their probability must fail the same test."""
    model = llama_factory(vocab_size=8, hidden_size=16, num_layers=1, seed=5, logit_scale=2.0)
    heads = random_heads(16, 2, std=0.5, seed=0)
    tree = [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0)]
    prompt = [1, 2]
    settings = SAMPLINGS[sampling]
    joint = exact_joint_of_tokens_2_and_3(model, prompt, SamplingConfig(**settings))
    lossless = sample_tokens_2_and_3(model, MedusaDrafter(heads, tree), prompt, 1500, settings)
    assert chi_square(lossless, joint) > 1e-3
    dropping = sample_tokens_2_and_3(model, DroppingUnlikelyCandidates(heads, tree), prompt, 1500, settings)
    assert chi_square(dropping, joint) < 1e-6
    typical = sample_tokens_2_and_3(model, MedusaDrafter(heads, tree, acceptance="typical"), prompt, 300, settings)
    assert chi_square(typical, joint) < 1e-6


def test_heads_round_trip_through_a_folder(tmp_path):
    heads = random_heads(16, 3, std=0.1, seed=1)
    heads.tree, heads.card = TREE, {"top1": [0.5, 0.3, 0.2]}
    heads.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "model.safetensors"}
    loaded = MedusaHeads.load(tmp_path)
    assert loaded.tree == TREE and loaded.card == heads.card and loaded.num_heads == 3
    hidden = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(hidden), heads(hidden), atol=2e-3, rtol=1e-3)  # fp16 on disk
    assert MedusaDrafter(loaded).choices == TREE  # the saved tree is the default


def test_bad_inputs_are_named(tiny_target, tmp_path):
    with pytest.raises(ValueError, match="acceptance must be"):
        MedusaDrafter(random_heads(48, 2, 0.1, 0), acceptance="greedy")
    with pytest.raises(ValueError, match="1..2 non-negative ranks"):
        MedusaDrafter(random_heads(48, 2, 0.1, 0), tree=[(0,), (0, 0, 0)])
    with pytest.raises(ValueError, match="hidden size"):
        sd.generate(tiny_target, [1, 2, 3], drafter=MedusaDrafter(random_heads(32, 2, 0.1, 0)), max_new_tokens=4)
    with pytest.raises(FileNotFoundError, match="no Medusa heads"):
        MedusaHeads.load(tmp_path)


def test_zoo_heads_equal_plain_greedy_on_heldout_prompts():
    """The shipped heads on the shipped target: 20 held-out prompts (signature + docstring), 48 new tokens."""
    from specdec_lab.train.corpus import heldout_prompts

    zoo = zoo_path()
    target, tokenizer = sd.load_model(zoo / "target", device="cpu")
    drafter = MedusaDrafter.from_pretrained(zoo / "medusa", target)
    accepted = 0
    for text in heldout_prompts(20):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = sd.generate(target, ids, max_new_tokens=48)
        out = sd.generate(target, ids, drafter=drafter, max_new_tokens=48)
        assert_same_or_near_tie(target, ids, out.tokens, plain.tokens)
        accepted += out.stats.accepted
    assert accepted > 0


def test_sampling_with_a_tree_shallower_than_the_heads(tiny_target, prompts):
    # The shipped sparse tree can stop above the last head: sampling must not draw from heads it does not use.
    heads = random_heads(tiny_target.config.hidden_size, 4, std=0.5, seed=2)
    drafter = MedusaDrafter(heads, [(0,), (1,), (0, 0)])
    out = sd.generate(tiny_target, prompts[0], drafter=drafter, max_new_tokens=12, temperature=1.0, seed=3)
    assert len(out.tokens) == 12 and max(out.stats.accepted_per_step) <= 2
