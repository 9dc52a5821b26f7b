"""Language-model stages of the zoo: pre-train the target, distil the draft from it.

The models are plain `LlamaForCausalLM`, so every Hugging Face tool loads them. The draft is trained to
match the target's next-token distribution (forward KL on the target's logits), which is what speculative
decoding rewards: acceptance depends on how close q is to p, not on the draft's own perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from specdec_lab.train.loop import bf16_here, train, training_forward
from specdec_lab.train.recipe import ModelShape, RunConfig

if TYPE_CHECKING:
    from specdec_lab.train.target_outputs import TrainingMix


def build_llama(shape: ModelShape, vocab_size: int, eos_token_id: int, seed: int) -> LlamaForCausalLM:
    """A freshly initialised Llama of the given shape (tied input/output embeddings keep it small)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def tokenize_stream(texts: list[str], tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """All documents as one token stream, each followed by end-of-text (int32 to keep it small)."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.int32)


def sample_batch(stream: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """`batch_size` random windows of `seq_len + 1` tokens, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()]).long()


def fixed_eval_batches(stream: torch.Tensor, run: RunConfig) -> list[torch.Tensor]:
    """The same validation windows at every evaluation, so the curve is comparable across steps."""
    return [sample_batch(stream, run.batch_size, run.seq_len, 10_000 + i) for i in range(run.eval_batches)]


@torch.no_grad()
def mean_loss(model: LlamaForCausalLM, batches: list[torch.Tensor]) -> float:
    """Mean next-token cross-entropy (nats/token) of `model` on `batches`."""
    total = 0.0
    for batch in batches:
        logits = model(batch[:, :-1]).logits
        total += F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()).item()
    return total / len(batches)


def pretrain_target(model: LlamaForCausalLM, train_stream: torch.Tensor, val_stream: torch.Tensor,
                    run: RunConfig, workdir: Path, max_minutes: float | None = None,
                    quality: Callable[[LlamaForCausalLM], dict] | None = None, carry: Path | None = None) -> dict:
    """Next-token pre-training of the target; returns validation loss and perplexity.

    quality: figures measured on the model's own text at each evaluation (e.g. its parse rate), merged into
    the evaluation, where `run.select_by` can pick the exported weights by one of them; carry: a committed
    copy of an unfinished run to resume from on a machine without the checkpoint (see `loop.write_carry`).
    """
    val = fixed_eval_batches(val_stream, run)
    forward = training_forward(model, run)
    return train(model, lambda step: next_token_loss(forward, train_stream, run, step),
                 lambda: target_evaluation(model, val, quality), run, workdir, "target", max_minutes, carry)


def next_token_loss(forward: Callable, stream: torch.Tensor, run: RunConfig, step: int) -> torch.Tensor:
    """The next-token cross-entropy of training step `step` on a batch of `stream` drawn from the step number
    (so a resumed run sees the same data); forward: the model's training forward."""
    batch = sample_batch(stream, run.batch_size, run.seq_len, run.seed * 1_000_003 + step)
    logits = forward(batch[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def target_evaluation(model: LlamaForCausalLM, val: list[torch.Tensor],
                      quality: Callable[[LlamaForCausalLM], dict] | None) -> dict:
    """A target phase's evaluation: validation loss and perplexity on `val`, plus `quality`'s figures."""
    loss = mean_loss(model, val)
    return {"val_loss": loss, "val_ppl": math.exp(loss), **(quality(model) if quality else {})}


def teacher_forward(target: LlamaForCausalLM, run: RunConfig, ids: torch.Tensor, **kwargs):
    """The frozen target's forward on training windows, under bf16 autocast where `run.bf16` asks and `bf16_here`
    agrees (the teacher's forward is most of a draft or head step's cost, and it needs no gradient)."""
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16,
                                        enabled=bf16_here(run, ids.device.type)):
        return target(ids, **kwargs)


def distill_draft(draft: LlamaForCausalLM, target: LlamaForCausalLM, data: TrainingMix,
                  val_stream: torch.Tensor, run: RunConfig, workdir: Path,
                  max_minutes: float | None = None, teacher_temperature: float = 1.0,
                  carry: Path | None = None) -> dict:
    """Train the draft on KL(p_target || q_draft); returns its validation loss and greedy agreement.

    data: where training windows come from (corpus, optionally mixed with target-written text);
    val_stream: corpus validation tokens; run: optimisation settings; workdir: checkpoints and log;
    teacher_temperature: below 1, the draft learns the target's distribution sharpened (logits divided by
    it), which moves its mass toward the target's top token, the one greedy verification accepts;
    carry: a committed copy of an unfinished run to resume from (see `loop.write_carry`).
    """
    target.eval().requires_grad_(False)
    val = fixed_eval_batches(val_stream, run)
    forward = training_forward(draft, run)

    def loss_on_batch(step: int) -> torch.Tensor:
        batch = data.batch(run.batch_size, run.seq_len, run.seed * 1_000_003 + step)
        teacher = teacher_forward(target, run, batch[:, :-1]).logits.float()
        p_log = F.log_softmax(teacher / teacher_temperature, dim=-1)
        q_log = F.log_softmax(forward(batch[:, :-1]).logits.float(), dim=-1)
        return F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True, reduction="batchmean")

    def evaluate() -> dict:
        agree, count = 0, 0
        for batch in val:
            same = draft(batch[:, :-1]).logits.argmax(-1) == target(batch[:, :-1]).logits.argmax(-1)
            agree += same.sum().item()
            count += same.numel()
        return {"val_loss": mean_loss(draft, val), "greedy_agreement": agree / count}

    return train(draft, loss_on_batch, evaluate, run, workdir, "draft", max_minutes, carry)
