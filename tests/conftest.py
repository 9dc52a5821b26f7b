"""Shared fixtures: small random Llama models (built in memory or saved and loaded like real checkpoints).

Every model is seeded, so tests are deterministic. Threads are pinned to one so several test processes can
share the machine. Without CUDA, Triton kernels run through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import itertools
import os
import shutil
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's kernels run on CPU tensors through its interpreter; the switch must be set before anything imports
    # triton (transformers does, indirectly), hence here, before the imports below.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import LlamaConfig, LlamaForCausalLM

from specdec_lab.models import zoo_path
from specdec_lab.train.recipe import ModelShape, RunConfig, TargetOutputs, ZooRecipe

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


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square goodness-of-fit test: were `counts` drawn from `probs`?

    counts: how often each outcome was observed (any shape); probs: the claimed probability of each outcome
    (same shape). Outcomes expected fewer than `min_expected` times are pooled into one cell, since the
    chi-square approximation needs a handful of expected hits per cell. An outcome observed although its
    probability is 0 gives p = 0: no sampling noise explains it. The p-value is the regularized upper
    incomplete gamma function Q(dof / 2, statistic / 2), so no scipy is needed.
    """
    counts, probs = counts.flatten().double(), probs.flatten().double()
    if bool(((probs <= 0) & (counts > 0)).any()):
        return 0.0
    expected = probs / probs.sum() * counts.sum()
    small = expected < min_expected
    observed_cells, expected_cells = counts[~small].tolist(), expected[~small].tolist()
    pooled_observed, pooled_expected = float(counts[small].sum()), float(expected[small].sum())
    if pooled_expected >= min_expected or (pooled_expected > 0 and not expected_cells):
        observed_cells.append(pooled_observed)
        expected_cells.append(pooled_expected)
    elif pooled_expected > 0:  # too small to stand alone: merge it into the smallest regular cell
        smallest = min(range(len(expected_cells)), key=expected_cells.__getitem__)
        observed_cells[smallest] += pooled_observed
        expected_cells[smallest] += pooled_expected
    dof = len(expected_cells) - 1
    if dof < 1:
        return 1.0
    observed_t, expected_t = torch.tensor(observed_cells), torch.tensor(expected_cells, dtype=torch.float64)
    statistic = ((observed_t - expected_t) ** 2 / expected_t).sum()
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


@pytest.fixture(scope="session")
def chi_square():
    """`chi_square_pvalue(counts, probs)`: goodness-of-fit p-value, for statistical (losslessness) tests."""
    return chi_square_pvalue


def make_bigram_llama(transition_logits: torch.Tensor, context_scale: float = 10.0, seed: int = 0,
                      max_positions: int = 256) -> LlamaForCausalLM:
    """A real Llama whose next-token logits are (almost) a chosen table: a model with known distributions.

    transition_logits: (V, V), row a = the logits of the token after token a (V even). Each token embeds
    as a one-hot vector that the final RMSNorm scales by sqrt(V); the LM head maps it back to its row. The
    attention and MLP outputs are scaled by `context_scale` from their small random initialisation, so the
    distribution also depends a little on the earlier context (and a broken KV cache would show).
    """
    vocab = transition_logits.shape[0]
    model = make_llama(vocab_size=vocab, hidden_size=vocab, num_layers=1, seed=seed, max_positions=max_positions)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        model.lm_head.weight.copy_(transition_logits.T / vocab**0.5)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(context_scale)
            layer.mlp.down_proj.weight.mul_(context_scale)
    return model


@pytest.fixture(scope="session")
def saved_models(tmp_path_factory):
    """Tiny random target and draft saved like the zoo: `<root>/tokenizer`, `<root>/target`, `<root>/draft`
    (the zoo's real tokenizer in the sibling folder), plus `<root>/standalone`, a model folder that holds
    its own copy of the tokenizer, and `<root>/other-vocab`, a model whose tokenizer has a different
    vocabulary. Returns the root folder."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("saved-models")
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))
    tokenizer.save_pretrained(str(root / "tokenizer"))
    vocab = len(tokenizer)
    eos = tokenizer.eos_token_id
    make_llama(vocab_size=vocab, hidden_size=32, num_layers=2, seed=0, eos_token_id=eos).save_pretrained(
        str(root / "target"))
    make_llama(vocab_size=vocab, hidden_size=16, num_layers=1, seed=1, eos_token_id=eos).save_pretrained(
        str(root / "draft"))
    standalone = make_llama(vocab_size=vocab, hidden_size=16, num_layers=1, seed=2, eos_token_id=eos)
    standalone.save_pretrained(str(root / "standalone"))
    tokenizer.save_pretrained(str(root / "standalone"))
    other = tokenizer.train_new_from_iterator(["def f(x):\n    return x + 1\n"] * 20, vocab_size=300)
    make_llama(vocab_size=len(other), hidden_size=16, num_layers=1, seed=3).save_pretrained(str(root / "other-vocab"))
    other.save_pretrained(str(root / "other-vocab"))
    return root


@pytest.fixture(scope="session")
def sequence_probabilities():
    """Exact target probabilities of every continuation of `length` tokens (small vocabularies only).

    Returns (sequences, probabilities): all token tuples in itertools order, and P(sequence | prompt) under
    `config` computed from the model's own conditionals, for chi-square tests of whole sampled outputs.
    """

    def enumerate_sequences(model, prompt: list[int], length: int, config) -> tuple[list[tuple], list[float]]:
        from specdec_lab.sampling import process_logits

        sequences = list(itertools.product(range(model.config.vocab_size), repeat=length))
        exact = []
        with torch.inference_mode():
            for seq in sequences:
                logits = model(torch.tensor([prompt + list(seq[:-1])])).logits[0, len(prompt) - 1 :]
                p = process_logits(logits, config)
                exact.append(float(torch.prod(p[torch.arange(length), torch.tensor(seq)])))
        return sequences, exact

    return enumerate_sequences


@pytest.fixture
def tiny_zoo():
    """Builds a throw-away zoo for the training stages: `tiny_zoo(tmp_path, tune)` -> (zoo folder, work folder)."""
    return build_tiny_zoo


def build_tiny_zoo(tmp_path, tune: bool) -> tuple:
    """A zoo folder with the real tokenizer, a tiny random target and a recipe for a tiny draft; the work
    folder holds synthetic token streams (what tokenising the corpus and completing prompts would cache)."""
    from specdec_lab.train.zoo import against_target

    zoo, runs = tmp_path / "zoo", tmp_path / "runs"
    shutil.copytree(zoo_path() / "tokenizer", zoo / "tokenizer")
    make_llama(vocab_size=4096, hidden_size=32, num_layers=1, seed=0, eos_token_id=0).save_pretrained(
        str(zoo / "target"))
    run = RunConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, eval_every=3, eval_batches=1)
    recipe = ZooRecipe("tiny", draft=ModelShape(16, 1, 2, 32, 64), draft_run=run,
                       draft_tune_run=RunConfig(**{**run.__dict__, "steps": 2}) if tune else None,
                       target_outputs=TargetOutputs(prompts=4, share=0.5), phase_check_prompts=2)
    recipe.save(zoo / "recipe.json")
    gen = torch.Generator().manual_seed(0)
    (runs / "tiny").mkdir(parents=True)
    torch.save({"train": torch.randint(1, 4096, (2000,), generator=gen, dtype=torch.int32),
                "val": torch.randint(1, 4096, (500,), generator=gen, dtype=torch.int32)}, runs / "tiny" / "streams.pt")
    outputs = against_target(runs / "tiny", zoo) / "target_outputs.pt"  # what this target would write
    outputs.parent.mkdir()
    torch.save(torch.randint(1, 4096, (800,), generator=gen, dtype=torch.int32), outputs)
    return zoo, runs
