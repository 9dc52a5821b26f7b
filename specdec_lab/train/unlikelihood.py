"""Teach the target to leave its loops: a short fine-tune with sequence-level unlikelihood (Welleck et al. 2020).

Trained by maximum likelihood alone, a small model decoded greedily falls into loops: one token, or a short
cycle of tokens, repeated until the budget runs out (the zoo's pre-trained target did so in about a fifth of
its held-out completions). Likelihood training only ever shows the model human text, never its own loops, so
nothing teaches it to leave them. Sequence-level unlikelihood training does (Welleck et al., "Neural Text
Generation with Unlikelihood Training", ICLR 2020): the model completes prompts itself, and each token of its
completions that carries a loop gets the loss -log(1 - p(token | prefix)), which pushes that token's
probability down; the usual next-token loss on the corpus, in the same step, keeps what the model knows.

Only tokens that carry a loop past `min_loop_tokens` tokens are penalised (`quality.loop_positions`): a short
cycle, or, where the recipe asks, a statement or two begun a third time in a row; the ordinary repetition of
code (a name used twice, a closing bracket after another, two similar lines) is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from specdec_lab.train.lm import fixed_eval_batches, next_token_loss, target_evaluation
from specdec_lab.train.loop import train, training_forward
from specdec_lab.train.quality import loop_positions
from specdec_lab.train.recipe import LoopUnlikelihood
from specdec_lab.train.target_outputs import left_padded_batch


@torch.no_grad()
def greedy_completions(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                       settings: LoopUnlikelihood) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The model's greedy completions of `prompts`, as it stands now.

    Prompts are padded and cut on the left (to `settings.max_prompt_tokens`), so every completion starts at the
    same column. Returns (ids (rows, prompt width + new tokens), attention mask of the same shape, prompt width).
    """
    batch = left_padded_batch(tokenizer, prompts, settings.max_prompt_tokens).to(model.device)
    was_training = model.training
    model.eval()
    ids = model.generate(**batch, max_new_tokens=settings.new_tokens, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    width = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones_like(ids[:, width:])], dim=1)
    return ids, mask, width


def before_end(completion: torch.Tensor, eos: int) -> torch.Tensor:
    """True for the tokens a completion wrote before its first end-of-text (generate pads after it)."""
    return (completion == eos).long().cumsum(dim=1) == 0


def unlikelihood_loss(forward: Callable, ids: torch.Tensor, mask: torch.Tensor, width: int,
                      marked: torch.Tensor) -> torch.Tensor:
    """Mean of -log(1 - p(token | prefix)) over the `marked` completion tokens (zero when none is marked).

    forward: the model's training forward; ids, mask, width: as `greedy_completions` returns them; marked:
    (rows, new tokens) bool, the completion tokens to push down.
    """
    if not marked.any():
        return torch.zeros((), device=ids.device)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # as generate numbered them, padding skipped
    logits = forward(ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1]).logits
    log_probs = F.log_softmax(logits[:, width - 1 :].float(), dim=-1)
    chosen = log_probs.gather(-1, ids[:, width:, None]).squeeze(-1).exp()
    penalty = -torch.log1p(-chosen.clamp(max=1 - 1e-5))  # -log(1 - p), kept finite where p rounds to 1
    return (penalty * marked).sum() / marked.sum()


def unlearn_loops(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, train_stream: torch.Tensor,
                  val_stream: torch.Tensor, prompts: list[str], settings: LoopUnlikelihood, workdir: Path,
                  max_minutes: float | None = None, quality: Callable[[LlamaForCausalLM], dict] | None = None,
                  carry: Path | None = None) -> dict:
    """Fine-tune the pre-trained target with the next-token loss plus loop unlikelihood; returns the last
    evaluation (validation loss and perplexity, plus `quality`'s figures) and the loop's timing.

    prompts: training-split prompts the model completes (each step draws `settings.prompts_per_step` of them);
    settings: the phase's recipe section; workdir: checkpoints and log; quality: figures on the model's own
    text at each evaluation (`settings.run.select_by` picks the exported weights by one of them); carry: a
    committed copy of an unfinished run to resume from (see `loop.write_carry`).
    """
    run = settings.run
    val = fixed_eval_batches(val_stream, run)
    forward = training_forward(model, run)

    def loss_on_batch(step: int) -> torch.Tensor:
        likelihood = next_token_loss(forward, train_stream, run, step)
        picks = torch.randint(0, len(prompts), (settings.prompts_per_step,),
                              generator=torch.Generator().manual_seed(run.seed * 1_000_003 + step + 7))
        ids, mask, width = greedy_completions(model, tokenizer, [prompts[i] for i in picks.tolist()], settings)
        completion = ids[:, width:]
        loops = loop_positions(completion, settings.min_loop_tokens, settings.max_loop_period, settings.loop_copies)
        marked = loops & before_end(completion, tokenizer.eos_token_id)
        return likelihood + settings.weight * unlikelihood_loss(forward, ids, mask, width, marked)

    return train(model, loss_on_batch, lambda: target_evaluation(model, val, quality), run, workdir,
                 "target-tune", max_minutes, carry)
