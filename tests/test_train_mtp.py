"""MTP training: module d pairs h^(d-1)_i with token i + d and learns token i + d + 1; the shared loop learns and
resumes exactly; the stage (`specdec train mtp`) writes loadable modules, its recipe section and its figures."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from specdec_lab.drafters.mtp import MTPConfig, MTPHeads, depth_inputs, depth_labels
from specdec_lab.train.mtp import mtp_losses, mtp_section, train_mtp
from specdec_lab.train.recipe import ModelShape, MTPRecipe, RunConfig, ZooRecipe
from specdec_lab.train.target_outputs import TrainingMix
from specdec_lab.train.zoo import STAGE_PHASES, against_target, carry_folder, run_stage, write_stage_carry


def new_heads(target, modules: int = 3, seed: int = 0) -> MTPHeads:
    torch.manual_seed(seed)
    heads = MTPHeads(MTPConfig.from_target(target, modules)).attach(target)
    heads.init_from_target_layer(target)
    return heads


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_module_d_reads_token_i_plus_d_and_learns_token_i_plus_d_plus_1(depth):
    window = torch.arange(100, 113)[None]  # x_j = 100 + j, so every token names its position
    inputs, labels = depth_inputs(window, depth), depth_labels(window, depth)
    positions = torch.arange(labels.shape[1])
    assert torch.equal(inputs[0, : len(positions)], 100 + positions + depth)
    assert torch.equal(labels[0], 100 + positions + depth + 1)  # not + depth: that is the token it reads
    assert inputs.shape[1] == labels.shape[1] + 1 == window.shape[1] - depth


def test_the_teacher_forced_pass_pairs_each_position_with_its_own_input_token(tiny_target):
    # Module d at position i must see x_(i+d) (changing it changes the output there) and nothing later
    # (changing x_(i+d+1), the token it is trained to predict, must not): the causal pairing training relies on.
    heads = new_heads(tiny_target).eval()
    window = torch.randint(0, 64, (1, 14), generator=torch.Generator().manual_seed(0))
    i = 5
    with torch.inference_mode():
        hidden = tiny_target(window, output_hidden_states=True).hidden_states[-1]
        base = heads.teacher_forced(hidden, window)
        for depth in (1, 2, 3):
            for offset, changes in ((depth, True), (depth + 1, False)):
                edited = window.clone()
                edited[0, i + offset] = (edited[0, i + offset] + 1) % 64
                out = heads.teacher_forced(hidden, edited)[depth - 1]  # the same h^0: only the token differs
                moved = not torch.allclose(out[0, i], base[depth - 1][0, i])
                assert moved == changes, (depth, offset)


def test_losses_are_cross_entropy_on_the_token_d_plus_1_ahead(tiny_target):
    heads = new_heads(tiny_target).eval()
    batch = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        results = mtp_losses(heads, tiny_target, batch)
        target_out = tiny_target(batch, output_hidden_states=True)
        outputs = heads.teacher_forced(target_out.hidden_states[-1], batch)
        for depth, result in enumerate(results, start=1):
            count = batch.shape[1] - 1 - depth  # positions whose token d + 1 ahead is in the window
            logits = heads.logits(outputs[depth - 1][:, :count])
            want = torch.stack([batch[:, i + depth + 1] for i in range(count)], dim=1)
            torch.testing.assert_close(result["ce"], F.cross_entropy(logits.flatten(0, 1), want.flatten()))
            target_top = target_out.logits[:, depth : depth + count].argmax(-1)  # the target's guess at that token
            assert result["acc"].item() == pytest.approx((logits.argmax(-1) == target_top).float().mean().item())
    assert len(results) == 3


def repetitive_stream(length: int = 3000) -> torch.Tensor:
    """A learnable stream: a fixed 7-token phrase repeated, with one seeded random token in ten."""
    gen = torch.Generator().manual_seed(0)
    stream = torch.tensor([3, 9, 27, 17, 51, 25, 11] * (length // 7), dtype=torch.int32)
    noise = torch.rand(len(stream), generator=gen) < 0.1
    stream[noise] = torch.randint(0, 64, (int(noise.sum()),), generator=gen, dtype=torch.int32)
    return stream


def tiny_recipe(steps: int) -> MTPRecipe:
    run = RunConfig(steps=steps, batch_size=4, seq_len=24, lr=3e-3, warmup_steps=2, eval_every=steps,
                    eval_batches=1, checkpoint_every=1000)
    return MTPRecipe(num_modules=3, run=run)


def test_training_learns_and_resumes_exactly(tiny_target, tmp_path):
    stream = repetitive_stream()
    recipe = tiny_recipe(20)
    heads = new_heads(tiny_target)
    batch = torch.stack([stream[i : i + 25] for i in (0, 100, 200, 300)]).long()
    with torch.no_grad():
        before = [r["ce"].item() for r in mtp_losses(heads, tiny_target, batch)]
    data = TrainingMix(stream)
    result = train_mtp(heads, tiny_target, data, stream, recipe, tmp_path / "straight")
    with torch.no_grad():
        after = [r["ce"].item() for r in mtp_losses(heads, tiny_target, batch)]
    assert result["finished"] and {"acc1", "acc2", "acc3", "top1_3", "ce3"} <= set(result)
    assert all(a < b - 0.5 for a, b in zip(after, before, strict=True)), (before, after)  # nats, every depth

    # Stopped after its first step (max_minutes=0), then resumed: the same weights as the straight run.
    resumed = new_heads(tiny_target)
    paused = train_mtp(resumed, tiny_target, data, stream, recipe, tmp_path / "paused", max_minutes=0)
    assert not paused["finished"] and paused["steps"] == 1
    train_mtp(resumed, tiny_target, data, stream, recipe, tmp_path / "paused")
    for (name, a), b in zip(heads.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def tiny_zoo_with_target(target, tmp_path, section: dict | None):
    zoo, runs = tmp_path / "zoo", tmp_path / "runs"
    target.save_pretrained(str(zoo / "target"))
    recipe = ZooRecipe("tiny", target=ModelShape(48, 2, 2, 96), extra={"medusa": {"heads": 3}})
    if section is not None:
        recipe.extra["mtp"] = section
    recipe.save(zoo / "recipe.json")
    # The token streams are cached in the work folder: synthetic ones stand in for the corpus and target text.
    (runs / "tiny").mkdir(parents=True)
    torch.save({"train": repetitive_stream(), "val": repetitive_stream(700)}, runs / "tiny" / "streams.pt")
    outputs = against_target(runs / "tiny", zoo) / "target_outputs.pt"
    outputs.parent.mkdir()
    torch.save(repetitive_stream(1400), outputs)
    return zoo, runs


def test_a_recipe_without_the_section_gets_the_defaults_and_keeps_the_rest(tiny_target, tmp_path):
    zoo, _ = tiny_zoo_with_target(tiny_target, tmp_path, None)
    assert mtp_section(zoo / "recipe.json") == MTPRecipe()
    saved = json.loads((zoo / "recipe.json").read_text())
    assert saved["mtp"] == asdict(MTPRecipe()) and saved["medusa"] == {"heads": 3}


def test_stage_pauses_carries_resumes_and_writes_modules_and_figures(tiny_target, tmp_path, capsys):
    from specdec_lab.cli import main

    section = asdict(tiny_recipe(4))
    zoo, runs = tiny_zoo_with_target(tiny_target, tmp_path, section)
    assert STAGE_PHASES["mtp"] == ("mtp",)
    paused = run_stage("mtp", zoo / "recipe.json", runs, max_minutes=0)  # the zoo's stage runner dispatches
    assert not paused["finished"] and paused["steps"] == 1 and not (zoo / "mtp").exists()
    assert write_stage_carry(zoo / "recipe.json", runs, "mtp")["step"] == 1

    main(["train", "mtp", "--recipe", str(zoo / "recipe.json"), "--workdir", str(runs)])  # resumes from step 1
    assert "mtp: {" in capsys.readouterr().out
    heads = MTPHeads.load(zoo / "mtp", tiny_target)
    assert heads.num_modules == 3 and heads.config.card["steps"] == 4
    card = json.loads((zoo / "training.json").read_text())["mtp"]
    run = section["run"]
    assert card["finished"] and card["steps"] == run["steps"] == card["planned_steps"]
    curve = card["learning_curve"]  # one point per evaluation; the last one is the final figures
    assert curve[-1]["tokens"] == card["tokens_seen"] == run["steps"] * run["batch_size"] * run["seq_len"]
    assert [curve[-1][f"acc{d}"] for d in (1, 2, 3)] == [card[f"acc{d}"] for d in (1, 2, 3)]
    assert heads.config.card["acc"] == [card[f"acc{d}"] for d in (1, 2, 3)]
    assert not carry_folder(zoo, "mtp").exists()  # a finished stage drops its carry
    assert json.loads((zoo / "recipe.json").read_text())["medusa"] == {"heads": 3}
