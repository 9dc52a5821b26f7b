"""Target-written training text: prompts from the training split, greedy completions, and the batch mix."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec_lab.train.corpus import function_prompts, heldout_prompts
from specdec_lab.train.recipe import TargetOutputs
from specdec_lab.train.target_outputs import TrainingMix, complete_prompts


def test_training_prompts_never_come_from_validation_files():
    train = function_prompts("train", 300)
    assert len(train) == 300
    assert all(p.startswith(("def ", "async def ", "@")) and p.endswith(('"', "'")) for p in train)
    assert not set(train) & set(heldout_prompts(100))


def test_each_record_is_the_prompt_then_the_targets_greedy_completion(saved_models):
    target = AutoModelForCausalLM.from_pretrained(str(saved_models / "target")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(saved_models / "tokenizer"))
    prompts = ["def add(a, b):\n    return", "x = [1, 2, 3]\nfor item in"]  # different lengths: left padding
    settings = TargetOutputs(new_tokens=6, max_prompt_tokens=64, batch_size=2)
    stream = complete_prompts(target, tokenizer, prompts, settings).tolist()
    eos = tokenizer.eos_token_id
    expected = []
    for text in prompts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out = target.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=eos)[0].tolist()
        completion = out[len(ids) :]
        if eos in completion:
            completion = completion[: completion.index(eos)]
        expected += ids + completion + [eos]
    assert stream == expected
    assert tokenizer.padding_side == "right"  # the caller's tokenizer is left as it was


def test_an_interrupted_generation_resumes_where_it_stopped(saved_models, tmp_path):
    """The partial file keeps the finished batches: a run killed in its third batch, run again, generates only
    the batches it had not finished and gives the uninterrupted stream; other prompts start afresh."""
    target = AutoModelForCausalLM.from_pretrained(str(saved_models / "target")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(saved_models / "tokenizer"))
    prompts = [f"def f{i}(x):\n    return x +" for i in range(6)]
    settings = TargetOutputs(new_tokens=4, max_prompt_tokens=32, batch_size=2)
    whole = complete_prompts(target, tokenizer, prompts, settings)

    class Interrupted(Exception):
        pass

    calls = []

    class Counting(torch.nn.Module):  # the real model, counting its batches and killed in the third
        def __init__(self, fail_at: int | None):
            super().__init__()
            self.fail_at = fail_at

        @property
        def device(self):
            return target.device

        def generate(self, **kwargs):
            calls.append(len(kwargs["input_ids"]))
            if len(calls) == self.fail_at:
                raise Interrupted
            return target.generate(**kwargs)

    partial = tmp_path / "outputs.pt.partial"
    with pytest.raises(Interrupted):
        complete_prompts(Counting(fail_at=3), tokenizer, prompts, settings, partial)
    assert partial.exists() and len(calls) == 3
    calls.clear()
    assert torch.equal(complete_prompts(Counting(None), tokenizer, prompts, settings, partial), whole)
    assert calls == [2], "only the unfinished batch is generated again"
    calls.clear()
    complete_prompts(Counting(None), tokenizer, prompts[:4], settings, partial)
    assert len(calls) == 2, "a partial file of other prompts is not resumed"


def test_long_prompts_keep_their_end():
    class Echo(torch.nn.Module):  # stands in for a model: "generates" nothing new, so only the prompt shows
        device = torch.device("cpu")

        def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
            return input_ids

    from specdec_lab.models import zoo_path

    tokenizer = AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))
    text = "value = compute(first, second, third, fourth, fifth)\n" * 4
    stream = complete_prompts(Echo(), tokenizer, [text], TargetOutputs(max_prompt_tokens=8)).tolist()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert stream == ids[-8:] + [tokenizer.eos_token_id]


def test_the_mix_draws_its_share_of_rows_from_the_target_outputs():
    corpus = torch.arange(0, 1000, dtype=torch.int32)
    outputs = torch.arange(5000, 6000, dtype=torch.int32)
    mix = TrainingMix(corpus, outputs, share=0.25)
    batch = mix.batch(8, 16, seed=3)
    assert batch.shape == (8, 17) and batch.dtype == torch.long
    from_outputs = (batch >= 5000).all(dim=1)
    assert from_outputs.sum() == 2 and not (batch[~from_outputs] >= 5000).any()
    assert torch.equal(batch, mix.batch(8, 16, seed=3)) and not torch.equal(batch, mix.batch(8, 16, seed=4))
    assert (TrainingMix(corpus).batch(8, 16, seed=3) < 1000).all()
    assert (TrainingMix(corpus, outputs, share=1.0).batch(8, 16, seed=3) >= 5000).all()
