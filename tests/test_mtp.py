"""MTP drafting (DeepSeek-V3 multi-token prediction): the modules, the chain drafter in the shared loop, saving.

Greedy runs must equal plain decoding; every draft must be what a teacher-forced pass over the context plus
the draft computes (the pass training uses); sampling runs must be distributed exactly as the target
(chi-square against the exact distribution, with a broken variant showing the test has the power to notice).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import specdec_lab as sd
from specdec_lab.drafters.mtp import MTPConfig, MTPDrafter, MTPHeads
from specdec_lab.sampling import SamplingConfig, process_logits


def random_heads(target: torch.nn.Module, modules: int = 3, seed: int = 0, warm: bool = True) -> MTPHeads:
    """Seeded modules for `target`; `warm`: decoder layers copied from the target's last layer (as training
    starts), which makes them agree with the target now and then, so drafts are partly accepted."""
    torch.manual_seed(seed)
    heads = MTPHeads(MTPConfig.from_target(target, modules)).attach(target)
    if warm:
        heads.init_from_target_layer(target)
    return heads.eval()


@pytest.fixture(scope="module")
def tiny_heads(tiny_target):
    return random_heads(tiny_target)


@pytest.mark.parametrize("depth", [1, 3])
def test_greedy_equals_plain_decoding(tiny_target, tiny_heads, prompts, depth):
    accepted = 0
    for prompt in prompts[:10] + [[7]]:  # a one-token prompt: the deeper modules start with nothing verified
        plain = sd.generate(tiny_target, prompt, max_new_tokens=16)
        out = sd.generate(tiny_target, prompt, drafter=MTPDrafter(tiny_heads, depth=depth), max_new_tokens=16)
        assert out.tokens == plain.tokens
        accepted += out.stats.accepted
    assert accepted > 0  # some drafts were (partly) kept, so the rollback after a partial accept was exercised


def teacher_forced_q(heads: MTPHeads, target, context: list[int], draft: list[int], sampling) -> torch.Tensor:
    """Each draft token's q from one teacher-forced pass of every module over context + draft (training's pass):
    depth d's distribution is module d's output at the last verified position."""
    window = torch.tensor([context + draft])
    with torch.inference_mode():
        hidden = target(window[:, :-1], output_hidden_states=True).hidden_states[-1]
        outputs = heads.teacher_forced(hidden, window)
        n = len(context) - 1
        return torch.stack([process_logits(heads.logits(outputs[d][0, n - 1]), sampling) for d in range(len(draft))])


@pytest.mark.parametrize("prompt", [[5, 17, 3, 42, 8, 9, 1], [7]])
def test_every_draft_is_the_teacher_forced_pass_over_context_and_draft(tiny_target, prompt):
    heads = random_heads(tiny_target, seed=4, warm=False)
    drafter = MTPDrafter(heads)
    records = []
    out = sd.generate(tiny_target, prompt, drafter=drafter, max_new_tokens=20, temperature=1.0, seed=2,
                      eos_token_id=-1, on_step=records.append)
    sampling = SamplingConfig(temperature=1.0)
    context = prompt + out.tokens[:1]  # the prompt and the target's first token (prefill)
    lengths = set()
    for record in records:
        draft = record.draft.tokens.tolist()
        if draft:
            want = teacher_forced_q(heads, tiny_target, context, draft, sampling)
            torch.testing.assert_close(record.draft.probs, want, atol=1e-5, rtol=1e-4)
            lengths.add(len(draft))
        context += record.emitted
    assert 3 in lengths  # full-depth drafts were checked
    n = len(context) - 1  # every module has seen exactly the positions whose inputs are all verified
    assert drafter.committed == [max(0, n - d + 1) for d in range(1, 4)]
    assert [cache.get_seq_length() for cache in drafter.caches] == drafter.committed


def test_bad_settings_and_mismatched_targets_are_rejected(tiny_target, tiny_heads, llama_factory):
    for depth in (0, 4, 2.5):
        with pytest.raises(ValueError, match="depth"):
            MTPDrafter(tiny_heads, depth=depth)
    with pytest.raises(ValueError, match="verification"):
        MTPDrafter(tiny_heads, verification="beam")
    with pytest.raises(ValueError, match="at least one module"):
        MTPHeads(MTPConfig.from_target(tiny_target, 0))
    other = llama_factory(vocab_size=64, hidden_size=32, num_layers=2)
    with pytest.raises(ValueError, match="hidden size 48"):
        MTPHeads(tiny_heads.config).attach(other)
    with pytest.raises(RuntimeError, match="not attached"):
        MTPHeads(tiny_heads.config).logits(torch.zeros(48))


def module_outputs(heads: MTPHeads, target, window: torch.Tensor) -> list[torch.Tensor]:
    with torch.inference_mode():
        hidden = target(window[:, :-1], output_hidden_states=True).hidden_states[-1]
        return heads.teacher_forced(hidden, window)


def test_heads_round_trip_through_their_folder(tiny_target, tiny_heads, tmp_path):
    tiny_heads.config.card = {"acc": [0.5, 0.25, 0.125]}
    tiny_heads.save(tmp_path / "mtp")
    loaded = MTPHeads.load(tmp_path / "mtp", tiny_target)
    assert loaded.config == tiny_heads.config and not loaded.training
    window = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    for got, want in zip(module_outputs(loaded, tiny_target, window), module_outputs(tiny_heads, tiny_target, window),
                         strict=True):
        torch.testing.assert_close(got, want, atol=3e-2, rtol=1e-2)  # fp16 storage
    drafter = MTPDrafter.from_pretrained(tmp_path / "mtp", tiny_target)
    plain = sd.generate(tiny_target, [3, 4, 5], max_new_tokens=10)
    assert sd.generate(tiny_target, [3, 4, 5], drafter=drafter, max_new_tokens=10).tokens == plain.tokens


def test_loading_names_what_is_wrong(tiny_target, tiny_heads, llama_factory, tmp_path):
    with pytest.raises(FileNotFoundError, match="no MTP heads.*config.json and model.safetensors missing"):
        MTPHeads.load(tmp_path / "nothing", tiny_target)
    folder = tmp_path / "mtp"
    tiny_heads.save(folder)
    weights = (folder / "model.safetensors").read_bytes()

    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors missing"):
        MTPHeads.load(folder, tiny_target)
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="cannot read .*model.safetensors"):
        MTPHeads.load(folder, tiny_target)
    (folder / "model.safetensors").write_bytes(weights)

    other = llama_factory(vocab_size=64, hidden_size=32, num_layers=2)
    with pytest.raises(ValueError, match="hidden size 48 .* hidden size 32"):
        MTPHeads.load(folder, other)

    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config.replace('"num_modules": 3', '"num_modules": 2'))
    with pytest.raises(ValueError, match="does not match its config.json"):
        MTPHeads.load(folder, tiny_target)
    (folder / "config.json").write_text(config[: len(config) // 2])
    with pytest.raises(ValueError, match="config.json is not an MTP config"):
        MTPHeads.load(folder, tiny_target)
    (folder / "config.json").write_text('{"hidden_size": 48}')
    with pytest.raises(ValueError, match="not an MTP config"):
        MTPHeads.load(folder, tiny_target)


# --- Losslessness under sampling -------------------------------------------------------------------------------


class ArgmaxClaimingQ(MTPDrafter):
    """BROKEN on purpose: drafts each module's argmax but tells the verifier it was sampled from q."""

    def propose(self, state, max_tokens):
        draft = super().propose(state, max_tokens)
        return sd.Draft(draft.probs.argmax(-1), draft.probs)


SAMPLINGS = {"T=1": {"temperature": 1.0}, "T=0.7,top-k=2": {"temperature": 0.7, "top_k": 2}}
# Tokens per sample: the target's first token (prefill), then a depth-2 draft (budget left: 3) and the bonus.
LENGTH = 4
VOCAB = 3  # 81 sequences: few enough cells for 400 samples (the broken variant measured p < 1e-40 at 400)
SAMPLES = 400


@pytest.fixture(scope="module")
def small_world(llama_factory):
    """A 3-token target, random 2-module MTP heads that disagree with it, the prompt, and P(every 4-token
    sequence) under each sampling setting."""
    target = llama_factory(vocab_size=VOCAB, hidden_size=16, num_layers=2, seed=5, logit_scale=2.0)
    heads = random_heads(target, modules=2, seed=6, warm=False)
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
    return target, heads, prompt, sequences, exact


def sample_counts(world, drafter_class, sampling: str) -> torch.Tensor:
    target, heads, prompt, sequences, _ = world
    index = {seq: i for i, seq in enumerate(sequences)}
    counts = torch.zeros(len(sequences))
    drafter = drafter_class(heads)  # one instance reused: `start` must reset it for every generation
    lengths = set()
    for seed in range(SAMPLES):
        out = sd.generate(target, prompt, drafter=drafter, max_new_tokens=LENGTH, seed=seed, eos_token_id=-1,
                          on_step=lambda record: lengths.add(len(record.draft)), **SAMPLINGS[sampling])
        counts[index[tuple(out.tokens)]] += 1
    assert 2 in lengths  # module 2 drafted too, not only module 1
    return counts


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_sampling_is_lossless_and_the_test_catches_a_broken_variant(small_world, chi_square, sampling):
    exact = small_world[-1][sampling]
    assert chi_square(sample_counts(small_world, MTPDrafter, sampling), exact) > 1e-3
    assert chi_square(sample_counts(small_world, ArgmaxClaimingQ, sampling), exact) < 1e-6


# --- Registered as a method: the CLI and the benchmark ----------------------------------------------------------


def test_cli_and_bench_build_mtp_from_the_zoo_and_say_when_it_is_missing(tiny_target, tiny_heads, tmp_path,
                                                                         monkeypatch):
    import specdec_lab
    from specdec_lab import bench_methods
    from specdec_lab.bench_runner import BenchConfig, BenchContext, MethodUnavailable
    from specdec_lab.cli import build_drafter
    from specdec_lab.models import ModelPair

    zoo = tmp_path / "zoo"
    zoo.mkdir()
    monkeypatch.setattr(specdec_lab, "zoo_path", lambda: zoo)
    monkeypatch.setattr(bench_methods, "zoo_path", lambda: zoo)
    pair = ModelPair(tiny_target, None, None)
    context = BenchContext(pair, BenchConfig(max_new_tokens=6), eos_token_id=None)
    method = next(m for m in bench_methods.all_methods() if m.name == "mtp")
    with pytest.raises(SystemExit, match="error: no MTP heads in .*mtp.*specdec train mtp"):
        build_drafter("mtp", pair, 4)
    with pytest.raises(MethodUnavailable, match="weights missing"):
        method.build(context)

    tiny_heads.save(zoo / "mtp")
    assert isinstance(build_drafter("mtp", pair, 4), MTPDrafter)
    result = method.build(context)([3, 4, 5], 0)
    assert result.tokens == sd.generate(tiny_target, [3, 4, 5], max_new_tokens=6).tokens


@pytest.mark.parametrize("prompt_set", ["heldout", "grounded"])
def test_zoo_modules_equal_plain_greedy_and_are_trained(prompt_set):
    """The shipped MTP modules on the shipped target, 10 prompts of each set, 48 new tokens: greedy output is
    plain decoding's (up to a numeric near-tie), and the target keeps a real share of what they draft (modules
    as warm-started, before training, keep almost nothing of it)."""
    from test_medusa import assert_same_or_near_tie

    from specdec_lab.bench import corpus_prompts

    torch.set_num_threads(1)
    pair = sd.load_pair()
    drafter = MTPDrafter.from_pretrained(sd.zoo_path() / "mtp", pair.target)
    untrained = MTPDrafter(random_heads(pair.target, drafter.heads.num_modules))
    kept = {"shipped": 0, "untrained": 0}
    for prompt in corpus_prompts(prompt_set, pair.tokenizer, 10, 400):
        plain = sd.generate(pair.target, prompt.ids, max_new_tokens=48)
        for name, candidate in (("shipped", drafter), ("untrained", untrained)):
            out = sd.generate(pair.target, prompt.ids, drafter=candidate, max_new_tokens=48)
            assert_same_or_near_tie(pair.target, prompt.ids, out.tokens, plain.tokens)
            kept[name] += out.stats.accepted
    assert kept["shipped"] > 2 * kept["untrained"], kept
