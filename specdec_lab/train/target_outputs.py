"""Training text written by the target itself, so that drafters learn what the target will actually say.

Speculative decoding is scored on the target's own outputs, not on human-written text. A drafter that also
trains on the target's greedy completions (sequence-level distillation: DistillSpec, Medusa-2's
self-distillation) agrees with the target more often than one trained on the corpus alone. The completions
start from training-split prompts, so the held-out prompts stay unseen.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerBase

from specdec_lab.train.corpus import function_prompts, load_corpus
from specdec_lab.train.lm import sample_batch
from specdec_lab.train.loop import save_whole
from specdec_lab.train.recipe import TargetOutputs


@torch.no_grad()
def complete_prompts(target: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                     settings: TargetOutputs, partial: Path | None = None) -> torch.Tensor:
    """Each prompt followed by the target's greedy completion and end-of-text, as one int32 token stream.

    prompts: the texts to complete; settings: completion length, prompt cut-off and batch size; partial: a file
    that keeps the batches finished so far (rewritten whole after each batch), so that a run interrupted after
    hours on a CPU resumes where it stopped instead of starting over. It is left in place; the caller removes it.
    """
    eos = tokenizer.eos_token_id
    key = progress_key(prompts, settings)
    done, stream = resumed(partial, key)
    batches = range(done, len(prompts), settings.batch_size)
    for start in tqdm(batches, desc="target outputs", dynamic_ncols=True, initial=done // settings.batch_size,
                      total=done // settings.batch_size + len(batches)):
        batch = left_padded_batch(tokenizer, prompts[start : start + settings.batch_size], settings.max_prompt_tokens)
        batch = batch.to(target.device)  # the prompts go where the target is (a GPU, when it trains there)
        out = target.generate(**batch, max_new_tokens=settings.new_tokens, do_sample=False, pad_token_id=eos)
        for row, mask in zip(out.tolist(), batch["attention_mask"].tolist(), strict=True):
            prompt = row[len(mask) - sum(mask) : len(mask)]  # drop the left padding
            completion = row[len(mask) :]
            if eos in completion:  # the model ended the text itself: keep that end, drop the padding after it
                completion = completion[: completion.index(eos)]
            stream.extend(prompt + completion + [eos])
        if partial is not None:
            save_whole({"key": key, "done": start + settings.batch_size, "stream": torch.tensor(stream,
                        dtype=torch.int32)}, partial)
    return torch.tensor(stream, dtype=torch.int32)


def left_padded_batch(tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_tokens: int):
    """`prompts` tokenised for batched generation: padded and cut on the left (to their last `max_tokens`
    tokens), so that every completion follows its prompt's end in the same column."""
    tokenizer = copy.copy(tokenizer)
    tokenizer.padding_side = tokenizer.truncation_side = "left"
    return tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=max_tokens,
                     add_special_tokens=False)


def progress_key(prompts: list[str], settings: TargetOutputs) -> str:
    """What a partial run must match to be resumed: the same prompts, completed with the same settings."""
    return hashlib.sha256(repr((prompts, settings)).encode()).hexdigest()[:16]


def resumed(partial: Path | None, key: str) -> tuple[int, list[int]]:
    """How many prompts a partial run of the same job finished, and its stream so far ((0, []) if none)."""
    if partial is None or not partial.exists():
        return 0, []
    saved = torch.load(partial)
    if saved.get("key") != key:
        return 0, []
    return int(saved["done"]), saved["stream"].tolist()


def target_output_stream(target: LlamaForCausalLM, tokenizer_dir: Path, settings: TargetOutputs,
                         val_percent: int, cache: Path) -> torch.Tensor:
    """The target-written stream, generated once and cached at `cache` (it takes an hour or more on a CPU;
    an interrupted generation resumes from `cache` with the suffix .partial).

    tokenizer_dir: the zoo's tokenizer folder; val_percent: the corpus split, so prompts come from training
    files only.
    """
    if cache.exists():
        return torch.load(cache)
    prompts = function_prompts("train", settings.prompts, load_corpus(val_percent=val_percent))
    partial = cache.with_name(cache.name + ".partial")
    stream = complete_prompts(target, AutoTokenizer.from_pretrained(str(tokenizer_dir)), prompts, settings,
                              partial)
    save_whole(stream, cache)
    partial.unlink(missing_ok=True)
    return stream


@dataclass
class TrainingMix:
    """Where training windows come from: the corpus, plus optionally a share of target-written text."""

    corpus: torch.Tensor
    outputs: torch.Tensor | None = None
    share: float = 0.0

    def batch(self, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
        """`batch_size` windows of `seq_len + 1` tokens; `share` of the rows from the target's outputs."""
        from_outputs = round(batch_size * self.share) if self.outputs is not None else 0
        rows = []
        if from_outputs < batch_size:  # a share of 1.0 reads the target's text only
            rows.append(sample_batch(self.corpus, batch_size - from_outputs, seq_len, seed))
        if from_outputs:
            rows.append(sample_batch(self.outputs, from_outputs, seq_len, seed + 500_009))
        return torch.cat(rows)
