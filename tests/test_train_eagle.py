"""EAGLE head training: the training-time-test unroll is what drafting computes, the loop learns and
resumes exactly, and the stage writes a loadable head, its recipe section and its figures into a zoo."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import load_file

from specdec_lab.drafters.eagle import EagleConfig, EagleHead, additive_mask, causal_allowed
from specdec_lab.sampling import SamplingConfig
from specdec_lab.train import eagle as eagle_training
from specdec_lab.train.eagle import EagleRecipe, eagle_losses, run_eagle_stage, train_head, unroll
from specdec_lab.train.recipe import ModelShape, RunConfig, ZooRecipe
from specdec_lab.train.target_outputs import TrainingMix
from specdec_lab.train.zoo import against_target


def test_unroll_equals_drafting_one_step_at_a_time(tiny_target):
    torch.manual_seed(0)
    head = EagleHead(EagleConfig.from_target(tiny_target, [0, 1, 2], "eagle3")).attach(tiny_target).eval()
    window = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    steps, chains = 3, 12 - 3
    with torch.inference_mode():
        hidden = tiny_target(window, output_hidden_states=True).hidden_states
        features = head.fuse_features(tuple(h[:, :chains] for h in hidden))
        unrolled = unroll(head, features, window, steps)
        for i in range(chains):  # drafting after a verified prefix of positions 0..i
            cache = head.new_cache()
            out = head(features[:, : i + 1], window[:, 1 : i + 2], torch.arange(i + 1)[None],
                       additive_mask(causal_allowed(i + 1, 0), torch.float32), cache)[:, -1:]
            sequential = [out]
            for s in range(2, steps + 1):
                out = head(out, window[:, i + s : i + s + 1], torch.tensor([[i + s - 1]]),
                           additive_mask(causal_allowed(1, i + s - 1), torch.float32), cache)
                sequential.append(out)
            for s in range(steps):
                torch.testing.assert_close(unrolled[s][:, i], sequential[s][:, 0], atol=1e-5, rtol=1e-4)


def tiny_recipe(steps: int, **overrides) -> EagleRecipe:
    run = RunConfig(steps=steps, batch_size=4, seq_len=24, lr=3e-3, warmup_steps=2, eval_every=steps,
                    eval_batches=1, checkpoint_every=1000)
    return EagleRecipe(run=run, **overrides)


def repetitive_stream(length: int = 4000) -> torch.Tensor:
    """A learnable stream: a fixed 7-token phrase repeated, with one seeded random token in ten."""
    gen = torch.Generator().manual_seed(0)
    stream = torch.tensor([3, 9, 27, 17, 51, 25, 11] * (length // 7), dtype=torch.int32)
    noise = torch.rand(len(stream), generator=gen) < 0.1
    stream[noise] = torch.randint(0, 64, (int(noise.sum()),), generator=gen, dtype=torch.int32)
    return stream


def new_head(target, recipe: EagleRecipe) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead(EagleConfig.from_target(target, recipe.feature_layers)).attach(target)
    head.init_from_target_layer(target)
    return head


def test_training_learns_and_resumes_exactly(tiny_target, tmp_path):
    stream = repetitive_stream()
    recipe = tiny_recipe(30)
    head = new_head(tiny_target, recipe)
    batch = torch.stack([stream[i : i + 25] for i in (0, 100, 200, 300)]).long()
    before = eagle_losses(head, tiny_target, batch, 1)[0]["cls"].item()
    data = TrainingMix(stream)
    result = train_head(head, tiny_target, data, stream, recipe, tmp_path / "straight", "eagle")
    after = eagle_losses(head, tiny_target, batch, 1)[0]["cls"].item()
    assert result["finished"] and after < before - 0.15  # nats; measured drop 0.25 (deterministic seeds)

    # Stopped after its first step (max_minutes=0), then resumed: the same weights as the straight run.
    resumed = new_head(tiny_target, recipe)
    paused = train_head(resumed, tiny_target, data, stream, recipe, tmp_path / "paused", "eagle", max_minutes=0)
    assert not paused["finished"] and paused["steps"] == 1
    train_head(resumed, tiny_target, data, stream, recipe, tmp_path / "paused", "eagle")
    for (name, a), b in zip(head.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_stage_writes_the_head_its_recipe_section_and_its_figures(tiny_target, tmp_path, monkeypatch):
    zoo, runs = tmp_path / "zoo", tmp_path / "runs"
    tiny_target.save_pretrained(str(zoo / "target"))
    recipe = ZooRecipe("tiny", target=ModelShape(48, 2, 2, 96), extra={"medusa": {"heads": 3}})
    recipe.save(zoo / "recipe.json")
    # The token streams are cached in the work folder: a synthetic one stands in for the tokenised corpus.
    (runs / "tiny").mkdir(parents=True)
    torch.save({"train": repetitive_stream(), "val": repetitive_stream(700)}, runs / "tiny" / "streams.pt")
    outputs = against_target(runs / "tiny", zoo) / "target_outputs.pt"  # and this target's own text
    outputs.parent.mkdir()
    torch.save(repetitive_stream(1400), outputs)
    section = {"eagle1": asdict(tiny_recipe(4)), "eagle3": asdict(tiny_recipe(3, feature_layers=[0, 1, 2],
                                                                               unroll_steps=2, reg_weight=0.0)),
               "eagle1-vllm": asdict(tiny_recipe(3, layout="vllm", target_outputs=False))}
    recipe.extra["eagle"] = section
    recipe.save(zoo / "recipe.json")

    partial = run_eagle_stage("eagle1", zoo / "recipe.json", runs, max_minutes=0, export_partial=True)
    assert not partial["finished"] and (zoo / "eagle" / "model.safetensors").exists()
    assert json.loads((zoo / "training.json").read_text())["eagle"]["steps"] == 1
    for variant, folder in (("eagle1", "eagle"), ("eagle3", "eagle3"), ("eagle1-vllm", "eagle-vllm")):
        if variant == "eagle1-vllm":  # the corpus-only variant never asks for the target's text
            monkeypatch.setattr(eagle_training, "training_data", lambda *args: pytest.fail("target text read"))
        result = run_eagle_stage(variant, zoo / "recipe.json", runs)
        assert result["finished"]
        head = EagleHead.load(zoo / folder, tiny_target)
        assert head.config.variant == variant
        card = json.loads((zoo / "training.json").read_text())[folder]
        assert card["steps"] == section[variant]["run"]["steps"] and "acc1" in card
        curve = card["learning_curve"]  # one point per evaluation, the last one the head's final figures
        run = section[variant]["run"]
        assert curve[-1]["tokens"] == card["tokens_seen"] == run["steps"] * run["batch_size"] * run["seq_len"]
        assert [curve[-1][f"acc{d}"] for d in range(1, 5)] == [card[f"acc{d}"] for d in range(1, 5)]
    from specdec_lab.train.card import scaling_curve

    table = scaling_curve(json.loads((zoo / "training.json").read_text()))
    assert "| eagle/ |" in table and "| eagle3/ |" in table and "depth 4" in table
    assert EagleHead.load(zoo / "eagle3", tiny_target).config.feature_layers == [0, 1, 2]
    assert EagleHead.load(zoo / "eagle-vllm", tiny_target).config.layout == "vllm"
    assert "fc.bias" not in load_file(str(zoo / "eagle-vllm" / "model.safetensors"))
    assert json.loads((zoo / "training.json").read_text())["eagle-vllm"]["target_outputs"] is False
    saved = json.loads((zoo / "recipe.json").read_text())
    assert saved["medusa"] == {"heads": 3} and saved["eagle"]["eagle3"]["unroll_steps"] == 2


def test_the_fitted_rank_temperature_is_the_one_with_the_highest_tau(tiny_target, prompts, tmp_path):
    import specdec_lab as sd
    from specdec_lab.drafters.eagle import EagleDrafter
    from specdec_lab.train.eagle import fit_rank_temperature

    torch.manual_seed(3)
    head = EagleHead(EagleConfig.from_target(tiny_target)).attach(tiny_target).eval()
    fit = fit_rank_temperature(head, tiny_target, prompts[:4], candidates=(1.0, 0.25), depth=4, top_k=3,
                               total_tokens=6, max_new_tokens=16)
    for temperature, tau in fit["tau"].items():  # each figure is what decoding with that temperature gives
        drafter = EagleDrafter(head, "tree", 4, 3, 6, temperature)
        runs = [sd.generate(tiny_target, p, drafter=drafter, max_new_tokens=16).stats for p in prompts[:4]]
        assert tau == round(sum(s.new_tokens for s in runs) / sum(s.target_forwards for s in runs), 3)
    assert fit["tau"][fit["best"]] == max(fit["tau"].values())

    # Stored in the head's config, the fitted value is what a drafter ranks by in greedy runs, where it was
    # fitted, unless told otherwise; sampling runs rank by q itself.
    head.config.rank_temperature = 0.25
    head.save(tmp_path / "eagle")
    loaded = EagleHead.load(tmp_path / "eagle", tiny_target)
    assert loaded.config.rank_temperature == 0.25
    greedy, sampling = SamplingConfig(), SamplingConfig(temperature=1.0)
    fitted, given = EagleDrafter(loaded, "tree"), EagleDrafter(loaded, "tree", rank_temperature=0.5)
    assert (fitted.ranking_temperature(greedy), fitted.ranking_temperature(sampling)) == (0.25, 1.0)
    assert (given.ranking_temperature(greedy), given.ranking_temperature(sampling)) == (0.5, 0.5)
