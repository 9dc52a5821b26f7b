"""The decode loop: lossless sampling end to end, greedy equality with Hugging Face, boundaries, bad input.

Losslessness is tested statistically through `generate` itself: on small models whose next-token
distributions are (almost) a chosen table, the first tokens that speculative decoding emits must be distributed
as target-only sampling, whose exact distribution is enumerated from the model. The same check must reject
the deliberately broken rules of test_verify.py when they are patched into the loop.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import make_bigram_llama, make_llama
from test_verify import BROKEN_RULES

import specdec_lab.decode as decode
from specdec_lab import DraftModelDrafter, PromptLookupDrafter, generate
from specdec_lab.drafters.base import Draft, Drafter
from specdec_lab.sampling import SamplingConfig, process_logits

NEW_TOKENS = 24


# --- Greedy equality ---------------------------------------------------------------------------------------------


def check_greedy_equal(target, prompt: list[int], tokens: list[int], reference: list[int], label: str) -> int | None:
    """Assert `tokens` equals the greedy `reference`, except after a near tie, and say where they part.

    The correctness contract allows one kind of divergence: at a position where the target's top-2 logits
    differ by less than 1e-4, fp32 rounding may pick either token, and the continuations then differ.
    Returns the index of such an allowed divergence, or None when the outputs are identical.
    """
    for i, (got, want) in enumerate(zip(tokens, reference, strict=False)):
        if got != want:
            with torch.no_grad():
                logits = target(input_ids=torch.tensor([prompt + reference[:i]])).logits[0, -1]
            top2 = logits.float().topk(2).values
            gap = float(top2[0] - top2[1])
            assert gap < 1e-4, (f"{label}: diverged from greedy decoding at new token {i} (got {got}, expected "
                                f"{want}); the target's top-2 logits there differ by {gap:.3g}, not a near tie")
            return i
    assert len(tokens) == len(reference), f"{label}: {len(tokens)} tokens instead of {len(reference)}"
    return None


def hf_greedy(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference: Hugging Face `generate(do_sample=False)` on the target alone."""
    ids = torch.tensor([prompt])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                          min_new_tokens=max_new_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def greedy_references(tiny_target, prompts):
    return [hf_greedy(tiny_target, prompt, NEW_TOKENS) for prompt in prompts]


DRAFTERS = {
    "plain": lambda target, draft: None,
    "draft model": lambda target, draft: DraftModelDrafter(draft, k=4),
    "draft = target": lambda target, draft: DraftModelDrafter(target, k=4),
    "prompt lookup": lambda target, draft: PromptLookupDrafter(max_ngram=3, k=4),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_output_equals_hugging_face_generate_on_20_prompts(name, tiny_target, tiny_draft, prompts,
                                                                   greedy_references):
    drafter = DRAFTERS[name](tiny_target, tiny_draft)
    assert len(prompts) >= 20
    for prompt, reference in zip(prompts, greedy_references, strict=True):
        out = generate(tiny_target, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS)
        check_greedy_equal(tiny_target, prompt, out.tokens, reference, f"{name}, prompt {prompt}")
        assert out.stopped_by == "max_new_tokens"


def test_the_greedy_comparison_names_a_divergence_that_is_not_a_near_tie(tiny_target, prompts, greedy_references):
    wrong = list(greedy_references[0])
    wrong[5] = (wrong[5] + 1) % 64
    with pytest.raises(AssertionError, match="diverged from greedy decoding at new token 5"):
        check_greedy_equal(tiny_target, prompts[0], wrong, greedy_references[0], "broken")


class TiedLogits:
    """A stand-in target whose logits tie exactly between tokens 3 and 4 after two new tokens."""

    def __call__(self, input_ids):
        logits = torch.zeros(1, input_ids.shape[1], 8)
        logits[0, -1, 3] = logits[0, -1, 4] = 1.0
        if input_ids.shape[1] != 4:  # elsewhere token 3 wins clearly
            logits[0, -1, 3] = 2.0
        return SimpleNamespace(logits=logits)


def test_the_greedy_comparison_allows_a_divergence_only_at_a_near_tie():
    reference = [3, 3, 3, 3]
    assert check_greedy_equal(TiedLogits(), [1, 2], [3, 3, 4, 0], reference, "tie") == 2
    with pytest.raises(AssertionError, match="at new token 1"):
        check_greedy_equal(TiedLogits(), [1, 2], [3, 4, 3, 3], reference, "no tie")
    with pytest.raises(AssertionError, match="3 tokens instead of 4"):
        check_greedy_equal(TiedLogits(), [1, 2], [3, 3, 3], reference, "short")


class PrefilledDraftModel(DraftModelDrafter):
    """A draft model that waits for the target's prefill, as drafters reading the target's features must."""

    drafts_from_prompt = False


@pytest.mark.parametrize("drafter_class", [DraftModelDrafter, PrefilledDraftModel])
def test_steps_emit_exactly_the_output(drafter_class, tiny_target, tiny_draft, prompts):
    steps = []
    out = generate(tiny_target, prompts[1], drafter=drafter_class(tiny_draft, k=3), max_new_tokens=20,
                   temperature=0.9, seed=4, on_step=steps.append)
    emitted = [token for step in steps for token in step.emitted]
    prefill_tokens = 0 if drafter_class.drafts_from_prompt else 1  # a separate prefill emits the first token
    assert out.tokens[prefill_tokens:] == emitted
    assert out.stats.target_forwards == len(steps) + prefill_tokens
    for step in steps:
        assert step.emitted[:-1] == step.draft.tokens[: step.verdict.accepted].tolist()
        assert step.target_logits.shape == (len(step.draft) + 1, 64)
        torch.testing.assert_close(step.target_probs.sum(-1), torch.ones(len(step.draft) + 1))


def test_the_first_draft_is_verified_in_the_prefill_forward(tiny_target, prompts, greedy_references):
    for prompt, reference in zip(prompts[:5], greedy_references, strict=False):
        merged = generate(tiny_target, prompt, drafter=DraftModelDrafter(tiny_target, k=4), max_new_tokens=20)
        prefilled = generate(tiny_target, prompt, drafter=PrefilledDraftModel(tiny_target, k=4), max_new_tokens=20)
        assert merged.tokens == prefilled.tokens == reference[:20]
        # 20 tokens in steps of 5: 4 forwards; a separate prefill costs 1 forward for its 1 token, then 4 steps
        assert (merged.stats.target_forwards, prefilled.stats.target_forwards) == (4, 5)


def test_a_tree_drafter_cannot_draft_from_the_prompt(tiny_target, prompts):
    class TreeFromPrompt(Drafter):
        drafts_from_prompt = True

        def propose(self, state, max_tokens):
            return Draft(torch.tensor([1, 2]), parents=torch.tensor([-1, -1]))

    with pytest.raises(ValueError, match="must not set drafts_from_prompt"):
        generate(tiny_target, prompts[0], drafter=TreeFromPrompt(), max_new_tokens=8)


# --- draft = target --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_equal_to_target_accepts_every_draft_token(temperature, tiny_target, prompts):
    for prompt in prompts[:5]:
        out = generate(tiny_target, prompt, drafter=DraftModelDrafter(tiny_target, k=4), max_new_tokens=21,
                       temperature=temperature, seed=1)
        assert out.stats.drafted == 16 and out.stats.acceptance_rate == 1.0
        assert out.stats.accepted_per_step == [4, 4, 4, 4, 0]  # the 21st token: no room left to draft


# --- Boundaries --------------------------------------------------------------------------------------------------


def first_new_occurrence(tokens: list[int], start: int, inside_draft_of_k: int | None = None) -> int:
    """The first index >= start whose token did not occur earlier (optionally: not at a bonus position
    when every step, the prefill included, emits k + 1 tokens), or -1 if there is none."""
    for i in range(start, len(tokens)):
        bonus = inside_draft_of_k is not None and i % (inside_draft_of_k + 1) == inside_draft_of_k
        if tokens[i] not in tokens[:i] and not bonus:
            return i
    return -1


def eos_cases(prompts, references, count: int) -> list[tuple[list[int], list[int], int]]:
    """(prompt, greedy reference, index) for the first `count` prompts whose greedy output has a token at
    index >= 2 that did not occur before it (random models often repeat one token forever)."""
    cases = [(p, r, first_new_occurrence(r, 2)) for p, r in zip(prompts, references, strict=True)]
    cases = [case for case in cases if case[2] >= 0][:count]
    assert len(cases) == count, "too few prompts with a usable EOS position"
    return cases


def test_eos_inside_a_draft_ends_the_output_right_after_it(tiny_target, prompts, greedy_references):
    prompt, reference = prompts[2], greedy_references[2]
    stop = first_new_occurrence(reference, 3, inside_draft_of_k=4)
    assert stop >= 0, reference
    eos = reference[stop]
    steps = []
    out = generate(tiny_target, prompt, drafter=DraftModelDrafter(tiny_target, k=4), max_new_tokens=NEW_TOKENS,
                   eos_token_id=eos, on_step=steps.append)
    assert out.tokens == reference[: stop + 1] and out.stopped_by == "eos"
    last = steps[-1]
    where = last.draft.tokens.tolist().index(eos)
    assert where < last.verdict.accepted  # the EOS was a kept draft token, not the target's own token
    assert last.emitted[-1] == eos and len(last.emitted) == where + 1  # accepted tokens after EOS were dropped
    assert out.stats.new_tokens == stop + 1


@pytest.mark.parametrize("name", ["plain", "draft model", "prompt lookup"])
def test_eos_stops_every_drafter_at_the_same_place(name, tiny_target, tiny_draft, prompts, greedy_references):
    for prompt, reference, stop in eos_cases(prompts, greedy_references, 6):
        out = generate(tiny_target, prompt, drafter=DRAFTERS[name](tiny_target, tiny_draft),
                       max_new_tokens=NEW_TOKENS, eos_token_id=reference[stop])
        assert out.tokens == reference[: stop + 1] and out.stopped_by == "eos"


def test_eos_as_the_very_first_token(tiny_target, prompts, greedy_references):
    out = generate(tiny_target, prompts[0], drafter=DraftModelDrafter(tiny_target, k=4),
                   eos_token_id=greedy_references[0][0])
    assert out.tokens == greedy_references[0][:1] and out.stopped_by == "eos"


def test_the_models_own_eos_is_the_default(prompts, greedy_references):
    [(prompt, reference, stop)] = eos_cases(prompts, greedy_references, 1)
    same_target = make_llama(vocab_size=64, hidden_size=48, num_layers=2, seed=0, logit_scale=4.0,
                             eos_token_id=reference[stop])
    out = generate(same_target, prompt, drafter=PromptLookupDrafter(k=4), max_new_tokens=NEW_TOKENS)
    assert out.tokens == reference[: stop + 1] and out.stopped_by == "eos"


def test_sampling_never_emits_past_eos(tiny_target, tiny_draft, prompts):
    eos = 7
    stopped = 0
    for seed in range(30):
        out = generate(tiny_target, prompts[seed % 20], drafter=DraftModelDrafter(tiny_draft, k=4),
                       max_new_tokens=30, temperature=1.5, seed=seed, eos_token_id=eos)
        assert eos not in out.tokens[:-1]
        stopped += out.stopped_by == "eos"
        assert (out.stopped_by == "eos") == (out.tokens[-1:] == [eos])
    assert stopped > 0  # the case was exercised


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", ["draft model", "draft = target", "prompt lookup"])
def test_max_new_tokens_from_0_to_k_plus_1_is_exact(name, temperature, tiny_target, tiny_draft, prompts,
                                                     greedy_references):
    for budget in range(0, 6):  # k = 4
        out = generate(tiny_target, prompts[4], drafter=DRAFTERS[name](tiny_target, tiny_draft),
                       max_new_tokens=budget, temperature=temperature, seed=2)
        assert len(out.tokens) == budget and out.stats.new_tokens == budget and out.stopped_by == "max_new_tokens"
        if temperature == 0:
            assert out.tokens == greedy_references[4][:budget]


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_a_one_token_prompt(name, tiny_target, tiny_draft):
    for token in (0, 17, 63):
        out = generate(tiny_target, [token], drafter=DRAFTERS[name](tiny_target, tiny_draft), max_new_tokens=12)
        check_greedy_equal(tiny_target, [token], out.tokens, hf_greedy(tiny_target, [token], 12), f"{name}, [{token}]")


@pytest.fixture(scope="module")
def short_context_pair():
    """Target and draft that only support 64 positions."""
    return make_llama(vocab_size=64, hidden_size=32, seed=5, max_positions=64, logit_scale=4.0), \
        make_llama(vocab_size=64, hidden_size=16, num_layers=1, seed=6, max_positions=64, logit_scale=4.0)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_output_stops_at_the_context_limit(name, short_context_pair):
    target, draft = short_context_pair
    prompt = torch.randint(0, 64, (60,), generator=torch.Generator().manual_seed(9)).tolist()
    out = generate(target, prompt, drafter=DRAFTERS[name](target, draft), max_new_tokens=10)
    assert len(out.tokens) == 4 and out.stopped_by == "context"
    check_greedy_equal(target, prompt, out.tokens, hf_greedy(target, prompt, 4), name)
    last = generate(target, prompt + out.tokens[:3], drafter=DRAFTERS[name](target, draft), max_new_tokens=10,
                    temperature=1.0)
    assert len(last.tokens) == 1 and last.stopped_by == "context"


# --- Bad input ---------------------------------------------------------------------------------------------------


def assert_raised_by_specdec(excinfo) -> None:
    """The error comes from specdec_lab's own checks, not from deep inside torch or transformers."""
    origin = str(excinfo.traceback[-1].path)
    assert "specdec_lab" in origin, f"raised from {origin}"


@pytest.mark.parametrize(("call", "message"), [
    (lambda t, d: generate(t, []), "the prompt is empty"),
    (lambda t, d: generate(t, torch.tensor([], dtype=torch.long)), "the prompt is empty"),
    (lambda t, d: generate(t, [1, 64]), r"prompt token ids must lie in \[0, 64\)"),
    (lambda t, d: generate(t, [1, 2], temperature=-0.5), "temperature must be >= 0"),
    (lambda t, d: generate(t, [1, 2], temperature=1.0, top_p=1.5), r"top_p must lie in \(0, 1\]"),
    (lambda t, d: generate(t, [1, 2], temperature=1.0, top_p=0.0), r"top_p must lie in \(0, 1\]"),
    (lambda t, d: generate(t, [1, 2], max_new_tokens=-1), "max_new_tokens must be a non-negative integer"),
    (lambda t, d: generate(t, [1] * 300), "the prompt has 300 tokens but the model's context is 256 tokens"),
    (lambda t, d: DraftModelDrafter(d, k=0), r"k \(tokens drafted per step\) must be a positive integer"),
    (lambda t, d: PromptLookupDrafter(k=0), r"k \(tokens drafted per step\) must be a positive integer"),
    (lambda t, d: generate(t, [1, 2], drafter=DraftModelDrafter(make_llama(vocab_size=32, hidden_size=16), k=2)),
     r"draft and target have different vocabularies \(32 vs 64 tokens\)"),
    (lambda t, d: generate(t, [1.5, 2.0]), r"integer token ids .*got 1\.5 of type float"),
    (lambda t, d: generate(t, torch.tensor([1.0, 2.0])), "integer token ids, got a tensor of dtype torch.float32"),
    (lambda t, d: generate(t, [1, 2], temperature=float("nan")), "temperature must be >= 0 and finite.*nan"),
    (lambda t, d: generate(t, [1, 2], temperature=float("inf")), "temperature must be >= 0 and finite.*inf"),
    (lambda t, d: generate(t, [1, 2], temperature=1.0, top_p=float("nan")), r"top_p must lie in \(0, 1\]"),
    (lambda t, d: generate(t, [1, 2], temperature=1.0, top_k=0), "top_k must be a positive integer"),
], ids=["empty list", "empty tensor", "id out of range", "negative temperature", "top_p > 1", "top_p = 0",
        "negative budget", "prompt longer than context", "draft-model k = 0", "lookup k = 0", "vocabularies differ",
        "float ids", "float tensor", "NaN temperature", "infinite temperature", "NaN top_p", "top_k = 0"])
def test_bad_input_gets_a_clear_error(call, message, tiny_target, tiny_draft):
    with pytest.raises(ValueError, match=message) as excinfo:
        call(tiny_target, tiny_draft)
    assert_raised_by_specdec(excinfo)


# --- Losslessness, end to end ---------------------------------------------------------------------------------------

VOCAB = 8
LOSSLESS_SAMPLES = 800
ALPHA = 1e-3
BROKEN_ALPHA = 1e-6
SETTINGS = {
    "temperature 1.0": SamplingConfig(1.0),
    "temperature 0.7": SamplingConfig(0.7),
    "top-k 3": SamplingConfig(1.0, top_k=3),
    "top-p 0.8, temperature 0.7": SamplingConfig(0.7, top_p=0.8),
}


@pytest.fixture(scope="module")
def known_models():
    """A target with known bigram-like distributions, a draft that sharpens and perturbs them (so drafts are
    accepted about half the time), and a prompt for each drafter."""
    generator = torch.Generator().manual_seed(2)
    target_logits = 1.5 * torch.randn(VOCAB, VOCAB, generator=generator)
    draft_logits = 4 * target_logits + torch.randn(VOCAB, VOCAB, generator=generator)
    target, draft = make_bigram_llama(target_logits), make_bigram_llama(draft_logits, seed=1)
    # Prompt lookup needs a context whose n-grams the target tends to repeat: a sample of the target itself.
    lookup_prompt = [0] + generate(target, [0], max_new_tokens=29, temperature=0.5, seed=11).tokens
    return {"draft model": (target, lambda: DraftModelDrafter(draft, k=1), list(range(VOCAB)) + [0]),
            "prompt lookup": (target, lambda: PromptLookupDrafter(max_ngram=1, k=1), lookup_prompt)}


@torch.no_grad()
def exact_first_tokens(target, prompt: list[int], config: SamplingConfig, count: int = 3) -> torch.Tensor:
    """The exact joint distribution (V,) * count of target-only sampling's first tokens, by enumeration."""
    joint = torch.ones(1, dtype=torch.float64)
    contexts = torch.tensor([prompt])
    for _ in range(count):
        probs = process_logits(target(input_ids=contexts).logits[:, -1], config).double()
        joint = (joint[:, None] * probs).reshape(-1)
        contexts = torch.cat([contexts.repeat_interleave(VOCAB, 0),
                              torch.arange(VOCAB).repeat(len(contexts))[:, None]], dim=1)
    return joint.reshape((VOCAB,) * count)


def sampled_first_tokens(target, prompt, make_drafter, config: SamplingConfig, samples: int, cache: str | None = None):
    """Counts (V, V, V) of the first three new tokens over `samples` seeds, and how often the verified step
    kept the draft (bonus token emitted) or rejected it (residual sample emitted). cache: `generate`'s."""
    counts = torch.zeros((VOCAB,) * 3)
    branches = {"kept": 0, "rejected": 0}

    def count_branch(step):
        if len(step.draft):
            branches["rejected" if step.verdict.resampled else "kept"] += 1

    drafter = make_drafter()
    for seed in range(samples):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=3, temperature=config.temperature,
                       top_k=config.top_k, top_p=config.top_p, seed=seed, on_step=count_branch, cache=cache)
        counts[tuple(out.tokens)] += 1
    return counts, branches


def lossless_p_value(counts: torch.Tensor, exact: torch.Tensor, chi_square) -> float:
    """Chi-square p-value for "same distribution", Bonferroni over two views: (1st, 2nd) token, where the 2nd
    is the verified draft token or the residual sample, and (2nd, 3rd), where the 3rd is often the bonus."""
    first_pair = chi_square(counts.sum(2), exact.sum(2))
    second_pair = chi_square(counts.sum(0), exact.sum(0))
    return min(1.0, 2 * min(first_pair, second_pair))


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("drafter_name", ["draft model", "prompt lookup"])
def test_speculative_sampling_is_distributed_as_target_sampling(drafter_name, setting, known_models, chi_square):
    target, make_drafter, prompt = known_models[drafter_name]
    config = SETTINGS[setting]
    counts, branches = sampled_first_tokens(target, prompt, make_drafter, config, LOSSLESS_SAMPLES)
    p_value = lossless_p_value(counts, exact_first_tokens(target, prompt, config), chi_square)
    assert p_value > ALPHA, f"{drafter_name}, {setting}: p = {p_value:.3g}"
    # Both outcomes of verification were exercised often.
    assert min(branches.values()) > LOSSLESS_SAMPLES // 10, branches


@pytest.mark.parametrize("broken", list(BROKEN_RULES))
@pytest.mark.parametrize("drafter_name", ["draft model", "prompt lookup"])
def test_the_end_to_end_check_rejects_a_broken_rule(drafter_name, broken, known_models, chi_square, monkeypatch):
    # The check above, with the same number of samples, run on a loop whose rejection rule is broken.
    target, make_drafter, prompt = known_models[drafter_name]
    config = SETTINGS["temperature 1.0"]
    monkeypatch.setattr(decode, "verify_rejection", BROKEN_RULES[broken])
    counts, _ = sampled_first_tokens(target, prompt, make_drafter, config, LOSSLESS_SAMPLES)
    p_value = lossless_p_value(counts, exact_first_tokens(target, prompt, config), chi_square)
    assert p_value < BROKEN_ALPHA, f"{drafter_name}, {broken}: p = {p_value:.3g}"


# --- The static cache: preallocated, rolled back by moving a length; the same outputs ------------------------------


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_static_cache_greedy_output_equals_hugging_face_generate(name, tiny_target, tiny_draft, prompts,
                                                                greedy_references):
    drafter = DRAFTERS[name](tiny_target, tiny_draft)
    for prompt, reference in zip(prompts, greedy_references, strict=True):
        out = generate(tiny_target, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS, cache="static")
        check_greedy_equal(tiny_target, prompt, out.tokens, reference, f"{name}, static cache, prompt {prompt}")


@pytest.mark.parametrize("setting", ["temperature 1.0", "top-p 0.8, temperature 0.7"])
def test_static_cache_sampling_is_distributed_as_target_sampling(setting, known_models, chi_square):
    target, make_drafter, prompt = known_models["draft model"]
    config = SETTINGS[setting]
    counts, branches = sampled_first_tokens(target, prompt, make_drafter, config, LOSSLESS_SAMPLES, cache="static")
    p_value = lossless_p_value(counts, exact_first_tokens(target, prompt, config), chi_square)
    assert p_value > ALPHA, f"static cache, {setting}: p = {p_value:.3g}"
    assert min(branches.values()) > LOSSLESS_SAMPLES // 10, branches


def tree_drafters(target):
    """One drafter of each tree kind: an EAGLE tree, a Medusa sparse tree, lookahead's window + n-gram tree."""
    from test_eagle import random_head
    from test_medusa import TREE, random_heads

    from specdec_lab.drafters.eagle import EagleDrafter
    from specdec_lab.drafters.lookahead import LookaheadDrafter
    from specdec_lab.drafters.medusa import MedusaDrafter

    return {"eagle tree": EagleDrafter(random_head(target), mode="tree", depth=4, top_k=3, total_tokens=10),
            "medusa": MedusaDrafter(random_heads(target.config.hidden_size, 3, std=0.05, seed=0), tree=TREE),
            "lookahead": LookaheadDrafter(window=3, ngram=3, pool_size=3)}


def test_static_cache_trees_keep_greedy_output_and_gather_scattered_paths(tiny_target, prompts, greedy_references):
    """Trees over the static cache: the accepted path's rows are gathered in place, lookahead's extra rows
    dropped; every output is still target-only greedy decoding."""
    scattered = 0

    def count_scattered(step):
        nonlocal scattered
        path = getattr(step.verdict, "path", None)
        scattered += bool(path) and path[-1] != len(path) - 1

    for name, drafter in tree_drafters(tiny_target).items():
        for prompt, reference in zip(prompts[:8], greedy_references, strict=False):
            out = generate(tiny_target, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS, cache="static",
                           on_step=count_scattered)
            check_greedy_equal(tiny_target, prompt, out.tokens, reference, f"{name}, static cache, prompt {prompt}")
    assert scattered > 5  # the in-place gather of a non-contiguous path was exercised


def test_static_cache_is_sized_to_the_run_and_shared_by_the_draft(tiny_target, tiny_draft, prompts):
    """The plan preallocates prompt + budget + a step's room, rounded to a power of two; drafters follow it."""
    from specdec_lab.cache import MIN_STATIC_LENGTH, RunStaticCache

    made = []
    original = decode.new_cache

    def recording(model, *args, **kwargs):
        made.append(original(model, *args, **kwargs))
        return made[-1]

    drafter = DraftModelDrafter(tiny_draft, k=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "new_cache", recording)
        generate(tiny_target, prompts[0], drafter=drafter, max_new_tokens=200, cache="static")
    assert isinstance(made[0], RunStaticCache) and isinstance(drafter.cache, RunStaticCache)
    needed = len(prompts[0]) + 200
    length = made[0].layers[0].max_cache_len
    assert length >= needed and length == max(MIN_STATIC_LENGTH, length) and length & (length - 1) == 0
    with pytest.raises(ValueError, match="cache must be one of dynamic, static"):
        generate(tiny_target, prompts[0], cache="paged")
    with pytest.raises(ValueError, match="compiled forwards need the static cache"):
        generate(tiny_target, prompts[0], cache="dynamic", compile=True)
