"""EAGLE drafting: the head, chain (EAGLE-1) and dynamic tree (EAGLE-2) modes in the shared decode loop.

Greedy runs must equal plain decoding; sampling runs must be distributed exactly as the target (chi-square
against the exact distribution, with a broken variant showing the test has the power to notice).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

import specdec_lab as sd
from specdec_lab.drafters.eagle import EagleConfig, EagleDrafter, EagleHead, additive_mask, causal_allowed
from specdec_lab.models import zoo_path
from specdec_lab.sampling import SamplingConfig, process_logits
from specdec_lab.tree import DraftTree

MODES = {"chain": dict(mode="chain", depth=4), "tree": dict(mode="tree", depth=4, top_k=3, total_tokens=10),
         "sharp-tree": dict(mode="tree", depth=4, top_k=3, total_tokens=10, rank_temperature=0.25)}


def random_head(target: torch.nn.Module, seed: int = 0, feature_layers: list[int] | None = None,
                sharpness: float = 1.0) -> EagleHead:
    """A seeded random head; `sharpness` > 1 scales its output norm, for peakier draft distributions."""
    torch.manual_seed(seed)
    head = EagleHead(EagleConfig.from_target(target, feature_layers)).attach(target).eval()
    with torch.no_grad():
        head.norm.weight.mul_(sharpness)
    return head


@pytest.fixture(scope="module")
def tiny_head(tiny_target):
    return random_head(tiny_target)


@pytest.mark.parametrize("mode", MODES)
def test_greedy_equals_plain_decoding(tiny_target, tiny_head, prompts, mode):
    accepted = 0
    for prompt in prompts:
        plain = sd.generate(tiny_target, prompt, max_new_tokens=24)
        out = sd.generate(tiny_target, prompt, drafter=EagleDrafter(tiny_head, **MODES[mode]), max_new_tokens=24)
        assert out.tokens == plain.tokens
        accepted += out.stats.accepted
    assert accepted > 0  # some drafts were (partly) kept, so the accepted-path bookkeeping was exercised


@pytest.mark.parametrize("mode", MODES)
def test_fused_head_greedy_equals_plain_decoding(tiny_target, prompts, mode):
    head = random_head(tiny_target, seed=3, feature_layers=[0, 1, 2])  # EAGLE-3 style fused input
    for prompt in prompts[:5]:
        plain = sd.generate(tiny_target, prompt, max_new_tokens=16)
        out = sd.generate(tiny_target, prompt, drafter=EagleDrafter(head, **MODES[mode]), max_new_tokens=16)
        assert out.tokens == plain.tokens


def test_a_head_in_vllms_layout_lacks_the_bias_and_norms_and_drafts_losslessly(tiny_target, prompts):
    torch.manual_seed(4)
    head = EagleHead(EagleConfig.from_target(tiny_target, None, "eagle1-vllm", "vllm")).attach(tiny_target).eval()
    assert head.fc.bias is None and isinstance(head.norm, torch.nn.Identity)
    assert isinstance(head.layer.input_layernorm, torch.nn.Identity)
    head.init_from_target_layer(tiny_target)  # the warm start copies what the layout has, skips what it lacks
    last = tiny_target.model.layers[-1]
    torch.testing.assert_close(head.layer.self_attn.q_proj.weight, last.self_attn.q_proj.weight)
    torch.testing.assert_close(head.layer.post_attention_layernorm.weight, last.post_attention_layernorm.weight)
    for mode in ("chain", "tree"):
        for prompt in prompts[:5]:
            plain = sd.generate(tiny_target, prompt, max_new_tokens=16)
            out = sd.generate(tiny_target, prompt, drafter=EagleDrafter(head, **MODES[mode]), max_new_tokens=16)
            assert out.tokens == plain.tokens
    with pytest.raises(ValueError, match="layout must be one of"):
        EagleConfig.from_target(tiny_target, None, layout="sglang")
    with pytest.raises(ValueError, match="reads one feature"):
        EagleConfig.from_target(tiny_target, [0, 1, 2], layout="vllm")


def fresh_head_keys(head: EagleHead, target: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """The head's cached keys after reading the whole verified sequence at once with true features."""
    with torch.inference_mode():
        hidden = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        n = len(tokens) - 1
        cache = head.new_cache()
        head(head.fuse_features(hidden), torch.tensor([tokens[1:]]), torch.arange(n)[None],
             additive_mask(causal_allowed(n, 0), torch.float32), cache)
    return cache.layers[0].keys


@pytest.mark.parametrize("mode", MODES)
def test_head_cache_holds_exactly_the_verified_prefix(tiny_target, tiny_head, prompts, mode):
    # After every commit the head's cache must equal what one pass over the true features would hold.
    drafter = EagleDrafter(tiny_head, **MODES[mode])
    out = sd.generate(tiny_target, prompts[0], drafter=drafter, max_new_tokens=20, eos_token_id=-1)
    tokens = prompts[0] + out.tokens
    want = fresh_head_keys(tiny_head, tiny_target, tokens)
    assert drafter.committed == len(tokens) - 1
    torch.testing.assert_close(drafter.cache.layers[0].keys, want, atol=1e-5, rtol=1e-4)


def next_log_probs(head: EagleHead, target: torch.nn.Module, context: list[int], path: list[int]) -> torch.Tensor:
    """The head's log-probabilities of the token after `context` + `path`, drafting one token at a time."""
    with torch.inference_mode():
        hidden = target(torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states
        n = len(context) - 1
        cache = head.new_cache()
        out = head(head.fuse_features(hidden), torch.tensor([context[1:]]), torch.arange(n)[None],
                   additive_mask(causal_allowed(n, 0), torch.float32), cache)[:, -1:]
        for i, token in enumerate(path):
            out = head(out, torch.tensor([[token]]), torch.tensor([[n + i]]),
                       additive_mask(causal_allowed(1, n + i), torch.float32), cache)
        return torch.log_softmax(head.logits(out[0, 0]), -1)


def reference_eagle2(head, target, context, depth, top_k, total_tokens) -> set[tuple[int, ...]]:
    """EAGLE-2's tree from its definition, every score computed by sequential drafting: the kept paths."""
    def children(path, score):
        log_q = next_log_probs(head, target, context, list(path))
        best = torch.topk(log_q, top_k)
        return {path + (t,): score + s for s, t in zip(best.values.tolist(), best.indices.tolist(), strict=True)}

    scores = children((), 0.0)
    for d in range(1, depth):
        layer = sorted((p for p in scores if len(p) == d), key=lambda p: -scores[p])[:top_k]
        for path in layer:
            scores.update(children(path, scores[path]))
    return set(sorted(scores, key=lambda p: -scores[p])[:total_tokens])


def test_tree_is_eagle2s_best_subtree_with_batched_expansion_matching_sequential_drafting(tiny_target):
    tiny_head = random_head(tiny_target, seed=2, sharpness=3.0)
    prompt = [5, 17, 3, 42, 8]
    drafts = []
    sd.generate(tiny_target, prompt, max_new_tokens=5, eos_token_id=-1,
                drafter=EagleDrafter(tiny_head, mode="tree", depth=3, top_k=3, total_tokens=10),
                on_step=lambda record: drafts.append(record.draft))
    draft = drafts[0]
    context = prompt + [int(tiny_target(torch.tensor([prompt])).logits[0, -1].argmax())]
    tree = DraftTree.from_parents(draft.tokens, draft.parents)
    got = {tuple(tree.tokens[tree.path_to(node)].tolist()) for node in range(len(tree))}
    assert len(tree) == 10 and tree.max_depth == 3
    assert got == reference_eagle2(tiny_head, tiny_target, context, depth=3, top_k=3, total_tokens=10)


def test_sharp_ranking_keeps_the_greedy_chain_when_the_budget_is_the_depth(tiny_target, tiny_head):
    # Near rank_temperature 0 every top child scores ~0 and every other node ~-inf, so a budget of `depth`
    # nodes keeps exactly the head's greedy chain; at 1.0 the same budget goes partly to siblings.
    prompt = [5, 17, 3, 42, 8]

    def first_draft(**settings):
        drafts = []
        sd.generate(tiny_target, prompt, max_new_tokens=12, eos_token_id=-1,
                    drafter=EagleDrafter(tiny_head, **settings), on_step=lambda record: drafts.append(record.draft))
        return drafts[0]

    chain = first_draft(mode="chain", depth=4)
    sharp = first_draft(mode="tree", depth=4, top_k=3, total_tokens=4, rank_temperature=1e-3)
    plain = first_draft(mode="tree", depth=4, top_k=3, total_tokens=4)
    assert sharp.tokens.tolist() == chain.tokens.tolist()
    assert sharp.parents is None  # a one-branch tree goes to the verifier as a chain (no tree mask)
    assert plain.parents is not None and plain.parents.tolist() != [-1, 0, 1, 2]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_one_branch_tree_is_verified_as_a_chain_and_keeps_greedy_output(tiny_target, tiny_head, temperature):
    prompt = [5, 17, 3, 42, 8]
    drafts = []
    out = sd.generate(tiny_target, prompt, max_new_tokens=12, eos_token_id=-1, temperature=temperature, seed=3,
                      drafter=EagleDrafter(tiny_head, mode="tree", depth=4, top_k=1, total_tokens=4),
                      on_step=lambda record: drafts.append(record.draft))
    assert drafts and all(d.parents is None for d in drafts)
    if temperature == 0:
        assert out.tokens == sd.generate(tiny_target, prompt, max_new_tokens=12, eos_token_id=-1).tokens
    else:  # sampled children carry their q, which the chain rule needs
        assert all(d.probs is not None and len(d.probs) == len(d.tokens) for d in drafts)


def test_sharp_ranking_keeps_the_tokens_top_p_allows(tiny_head):
    # Sharpening reorders the ranking only: a token top-p keeps stays rankable, one it removes stays out.
    state = SimpleNamespace(sampling=SamplingConfig(temperature=1.0, top_p=0.5))
    logits = torch.randn(64, generator=torch.Generator().manual_seed(0))
    plain = EagleDrafter(tiny_head, mode="tree")._log_q(logits, state)
    sharp = EagleDrafter(tiny_head, mode="tree", rank_temperature=0.25)._log_q(logits, state)
    assert 1 < int(plain.isfinite().sum()) < 64
    assert torch.equal(sharp.isfinite(), plain.isfinite())
    assert sharp.exp().sum().item() == pytest.approx(1.0)
    assert sharp.max() > plain.max()


def test_bad_settings_are_rejected(tiny_target, tiny_head, llama_factory):
    with pytest.raises(ValueError, match="mode"):
        EagleDrafter(tiny_head, mode="beam")
    with pytest.raises(ValueError, match="depth"):
        EagleDrafter(tiny_head, depth=0)
    with pytest.raises(ValueError, match="rank_temperature"):
        EagleDrafter(tiny_head, mode="tree", rank_temperature=0.0)
    other = llama_factory(vocab_size=64, hidden_size=32, num_layers=2)
    with pytest.raises(ValueError, match="hidden size"):
        EagleHead(tiny_head.config).attach(other)


def test_head_round_trips_through_its_folder(tiny_target, tiny_head, tmp_path):
    tiny_head.save(tmp_path / "eagle")
    loaded = EagleHead.load(tmp_path / "eagle", tiny_target)
    assert loaded.config == tiny_head.config
    features, tokens = torch.randn(1, 5, 48), torch.randint(0, 64, (1, 5))
    mask = additive_mask(causal_allowed(5, 0), torch.float32)
    with torch.inference_mode():
        want = tiny_head(features, tokens, torch.arange(5)[None], mask)
        got = loaded(features, tokens, torch.arange(5)[None], mask)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)  # fp16 storage
    with pytest.raises(FileNotFoundError, match="no EAGLE head"):
        EagleHead.load(tmp_path / "missing", tiny_target)


# --- Losslessness under sampling -------------------------------------------------------------------------------


class ArgmaxChainClaimingQ(EagleDrafter):
    """BROKEN on purpose: drafts the head's argmax but tells the verifier it was sampled from q."""

    def propose(self, state, max_tokens):
        draft = super().propose(state, max_tokens)
        return sd.Draft(draft.probs.argmax(-1), draft.probs)


class TreeClaimingUniformQ(EagleDrafter):
    """BROKEN on purpose: a deterministic top-k tree verified as if each node were drawn uniformly."""

    def propose(self, state, max_tokens):
        draft = super().propose(state, max_tokens)
        vocab = state.target.config.vocab_size
        draft.probs = torch.full((len(draft), vocab), 1.0 / vocab)
        return draft


class SampledTreeDroppingUnlikelySiblings(EagleDrafter):
    """BROKEN on purpose: draws a node's children from q, then drops every child that q finds much less
    likely than its favourite token, while still telling the verifier each kept child was drawn from its
    conditional q (the kept children are biased toward q's likely tokens)."""

    def draw_children(self, q, count, generator):
        tokens, conditionals = super().draw_children(q, count, generator)
        keep = [rank for rank, token in enumerate(tokens.tolist()) if q[token] >= 0.8 * q.max()]
        return tokens[keep], conditionals[keep]


SAMPLINGS = {"T=1": {"temperature": 1.0}, "T=0.7,top-k=3": {"temperature": 0.7, "top_k": 3}}
LENGTH = 3  # tokens per sample: depth-2 drafts are verified after the first token
VOCAB = 4


@pytest.fixture(scope="module")
def small_world(llama_factory):
    """A 4-token target, a random head that disagrees with it, the prompt, and P(every 3-token sequence) under
    each sampling setting of `SAMPLINGS`."""
    target = llama_factory(vocab_size=VOCAB, hidden_size=16, num_layers=2, seed=5, logit_scale=2.0)
    head = random_head(target, seed=6)
    prompt = [1, 2]
    sequences = list(itertools.product(range(VOCAB), repeat=LENGTH))
    exact = {}
    with torch.inference_mode():
        for name, sampling in SAMPLINGS.items():
            config = SamplingConfig(**sampling)
            probs = []
            for seq in sequences:
                logits = target(torch.tensor([prompt + list(seq[:-1])])).logits[0, len(prompt) - 1 :]
                p = process_logits(logits, config)
                probs.append(float(torch.prod(p[torch.arange(LENGTH), torch.tensor(seq)])))
            exact[name] = torch.tensor(probs)
    return target, head, prompt, sequences, exact


def sample_counts(world, drafter_class, settings, sampling: str, samples: int) -> torch.Tensor:
    target, head, prompt, sequences, _ = world
    index = {seq: i for i, seq in enumerate(sequences)}
    counts = torch.zeros(len(sequences))
    for seed in range(samples):
        out = sd.generate(target, prompt, drafter=drafter_class(head, **settings), max_new_tokens=LENGTH,
                          seed=seed, eos_token_id=-1, **SAMPLINGS[sampling])
        counts[index[tuple(out.tokens)]] += 1
    return counts


SAMPLING_MODES = {"chain": dict(mode="chain", depth=2),
                  "adaptive-chain": dict(mode="chain", depth=2, min_confidence=0.3),
                  "sampled-tree": dict(mode="tree", depth=2, top_k=3, total_tokens=6),
                  "top-tree": dict(mode="tree", depth=2, top_k=2, total_tokens=4, children="top"),
                  "sharp-top-tree": dict(mode="tree", depth=2, top_k=2, total_tokens=4, rank_temperature=0.25,
                                         children="top")}
BROKEN = {"chain": ArgmaxChainClaimingQ, "adaptive-chain": ArgmaxChainClaimingQ,
          "sampled-tree": SampledTreeDroppingUnlikelySiblings, "top-tree": TreeClaimingUniformQ,
          "sharp-top-tree": TreeClaimingUniformQ}


# Sampled trees under both settings; the chain and the point-mass trees (unchanged code) under top-k only.
CASES = [("sampled-tree", "T=1"), ("sampled-tree", "T=0.7,top-k=3"), ("chain", "T=0.7,top-k=3"),
         ("adaptive-chain", "T=1"),
         ("top-tree", "T=0.7,top-k=3"), ("sharp-top-tree", "T=0.7,top-k=3")]


@pytest.mark.parametrize(("mode", "sampling"), CASES)
def test_sampling_is_lossless_and_the_test_catches_a_broken_variant(small_world, chi_square, mode, sampling):
    exact = small_world[-1][sampling]
    counts = sample_counts(small_world, EagleDrafter, SAMPLING_MODES[mode], sampling, 1500)
    assert chi_square(counts, exact) > 1e-3
    broken = sample_counts(small_world, BROKEN[mode], SAMPLING_MODES[mode], sampling, 1500)
    assert chi_square(broken, exact) < 1e-6


def test_sampled_tree_draws_every_node_of_its_shape_and_carries_conditional_q(tiny_target, tiny_head):
    drafter = EagleDrafter(tiny_head, mode="tree", depth=3, top_k=3, total_tokens=9, alpha=0.5)
    seen = []
    with torch.inference_mode():
        sd.generate(tiny_target, [1, 2, 3], drafter=drafter, max_new_tokens=12, temperature=1.0, seed=0,
                    on_step=lambda record: seen.append(record.draft))
    for draft in seen:
        tree = DraftTree.from_parents(draft.tokens, draft.parents)
        shape, _ = drafter.sampled_shape(tree.max_depth)  # the last drafts are cut short by max_new_tokens
        assert len(tree) == len(shape)  # the full vocabulary is allowed, so every position of the shape exists
        for siblings in tree.children():
            for earlier, later in itertools.pairwise(siblings):
                # a later sibling's q has every earlier sibling's token removed, and sums to one
                assert draft.probs[later, draft.tokens[earlier]] == 0
            for child in siblings:
                torch.testing.assert_close(draft.probs[child].sum(), torch.tensor(1.0))
                assert draft.probs[child, draft.tokens[child]] > 0


# --- The shipped zoo head ---------------------------------------------------------------------------------------

ZOO_HEAD = zoo_path() / "eagle"


@pytest.mark.parametrize("mode", MODES)
def test_zoo_head_greedy_equals_plain_on_heldout_prompts(mode):
    from specdec_lab.train.corpus import heldout_prompts

    pair = sd.load_pair()
    head = EagleHead.load(ZOO_HEAD, pair.target)
    settings = dict(mode="chain", depth=5) if mode == "chain" else dict(
        mode="tree", depth=6, top_k=4, total_tokens=24, rank_temperature=MODES[mode].get("rank_temperature", 1.0))
    accepted = 0
    for text in heldout_prompts(20):
        ids = pair.tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = sd.generate(pair.target, ids, max_new_tokens=24)
        out = sd.generate(pair.target, ids, drafter=EagleDrafter(head, **settings), max_new_tokens=24)
        assert out.tokens == plain.tokens
        accepted += out.stats.accepted
    assert accepted > 0
