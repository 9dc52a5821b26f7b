"""The shared training loop: its reported training time ignores pauses, and a resumed run ends where a straight
run would."""

from __future__ import annotations

import json

import torch

from specdec_lab.train import loop
from specdec_lab.train.loop import bf16_here, lr_at, median_step_seconds, off_schedule, train, training_forward
from specdec_lab.train.recipe import RunConfig


def write_log(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_long_pause_does_not_count_as_training_time(tmp_path):
    # Steps of 2 s, but the process sat stopped for an hour before step 4.
    seconds = [2.0, 4.0, 6.0, 3606.0, 3608.0, 3610.0]
    write_log(tmp_path / "log.jsonl", [{"step": i + 1, "seconds": s} for i, s in enumerate(seconds)])
    assert median_step_seconds(tmp_path / "log.jsonl") == 2.0


def test_steps_repeated_after_a_resume_are_not_read_as_negative_gaps(tmp_path):
    # Killed after step 3 with its last checkpoint at step 2: step 3 runs again, its clock restarts at 4.0.
    records = [(1, 2.0), (2, 4.0), (3, 6.0), (3, 7.0), (4, 10.0), (5, 13.0)]
    write_log(tmp_path / "log.jsonl", [{"step": step, "seconds": s} for step, s in records])
    # Gaps 2, 2, 3, 3: median 2.5. Reading the 3 -> 3 pair as a 1 s step would give 2.
    assert median_step_seconds(tmp_path / "log.jsonl") == 2.5


def test_steps_trained_under_another_schedule_are_found_in_the_log(tmp_path):
    # 10 steps planned; stopped after step 5, cut to 6 steps and resumed from the step-4 checkpoint (step 5 replayed).
    planned = RunConfig(steps=10, batch_size=1, seq_len=1, warmup_steps=2)
    final = RunConfig(steps=6, batch_size=1, seq_len=1, warmup_steps=2)
    records = [{"step": s, "lr": lr_at(s - 1, planned)} for s in (1, 2, 3, 4, 5)]
    records += [{"step": s, "lr": lr_at(s - 1, final)} for s in (5, 6)]
    write_log(tmp_path / "log.jsonl", records)
    off = off_schedule(tmp_path / "log.jsonl", final)
    # Steps 1 to 3 get the same rate under both plans (warm-up, then the cosine's start); step 5's replay under the
    # final schedule is the update that stayed. Only step 4 ran at a rate the final recipe does not give it.
    assert (off["steps"], off["first_step"], off["last_step"]) == (1, 4, 4)
    assert off["lr_ratio_min"] == off["lr_ratio_max"] == round(lr_at(3, planned) / lr_at(3, final), 3) > 1
    assert off_schedule(tmp_path / "log.jsonl", planned)["first_step"] == 5  # judged against the old plan instead


def tiny_run(workdir, max_minutes=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))

    def loss_on_batch(step: int) -> torch.Tensor:
        batch = data[(step * 8) % 64:][:8]
        return (model(batch) - batch.sum(-1, keepdim=True)).pow(2).mean()

    run = RunConfig(steps=6, batch_size=8, seq_len=1, warmup_steps=1, eval_every=3, eval_batches=1,
                    checkpoint_every=1)
    result = train(model, loss_on_batch, lambda: {"val": 0.0}, run, workdir, "tiny", max_minutes)
    return model, result


def test_a_paused_run_resumes_to_the_same_weights_and_reports_compute_time(tmp_path):
    straight, done = tiny_run(tmp_path / "straight")
    tiny_run(tmp_path / "paused", max_minutes=0)  # stops (checkpointed) after its first step
    resumed, result = tiny_run(tmp_path / "paused")
    assert result["finished"] and result["steps"] == done["steps"] == 6
    assert torch.equal(resumed.weight, straight.weight)
    median = median_step_seconds(tmp_path / "paused" / "log.jsonl")
    assert result["compute_seconds"] == round(median * 6, 1)
    assert "off_schedule" not in result


def test_a_call_that_only_re_measures_reports_the_hardware_that_trained(tmp_path):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _, trained = tiny_run(tmp_path)
        torch.set_num_threads(2)  # e.g. the stage re-run on 2 threads to re-measure on a quiet machine
        _, again = tiny_run(tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert trained["hardware"].endswith("1 thread") and again["hardware"] == trained["hardware"]


def test_select_by_keeps_and_restores_the_best_evaluation(tmp_path):
    """With `select_by`, the weights of the evaluation that scored best are kept and `load_best` restores them,
    even when later steps score worse."""
    from specdec_lab.train.loop import load_best

    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    scores = iter([0.2, 0.9, 0.5])
    snapshots = []

    def evaluate() -> dict:
        snapshots.append(module.weight.detach().clone())
        return {"score": next(scores)}

    run = RunConfig(steps=6, warmup_steps=1, eval_every=2, checkpoint_every=2, select_by="score")
    result = train(module, lambda step: (module(torch.ones(1, 2)) ** 2).sum(), evaluate, run, tmp_path, "t")
    assert result["best"]["step"] == 4 and result["best"]["score"] == 0.9
    assert not torch.equal(module.weight, snapshots[1])
    load_best(module, result, tmp_path)
    assert torch.equal(module.weight, snapshots[1])


def test_a_carry_resumes_an_unfinished_run_on_a_new_machine(tmp_path):
    """A paused run copied by write_carry (fp16 weights, state, log) resumes in an empty work folder: it starts
    at the carried step with the carried weights, re-warms the learning rate, and the log says so."""
    from specdec_lab.train.loop import off_schedule, read_carry, write_carry

    run = RunConfig(steps=8, warmup_steps=2, eval_every=100, checkpoint_every=1, lr=1e-2)

    def fresh() -> torch.nn.Linear:
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1)

    def loss_of(module):
        return lambda step: ((module(torch.ones(1, 4)) - 1.0) ** 2).sum()

    first = fresh()
    train(first, loss_of(first), dict, run, tmp_path / "a", "t", max_minutes=0)  # stops after one step
    state = write_carry(tmp_path / "a", tmp_path / "carry")
    assert state["step"] == 1
    loaded = fresh()
    (tmp_path / "c").mkdir()
    assert read_carry(loaded, tmp_path / "carry", tmp_path / "c")["restarted_at"] == 1
    assert torch.allclose(loaded.weight, first.weight, atol=1e-3) and not torch.equal(loaded.weight, fresh().weight)
    resumed = fresh()
    result = train(resumed, loss_of(resumed), dict, run, tmp_path / "b", "t", carry=tmp_path / "carry")
    assert result["steps"] == 8 and result["finished"]
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    assert off_schedule(tmp_path / "b" / "log.jsonl", run)["first_step"] == 2  # the re-warm-up is disclosed


def test_bf16_autocast_only_where_the_cpu_computes_bf16(monkeypatch):
    """A recipe's bf16 is honoured on a CPU with bf16 kernels and dropped (fp32 compute) on one without, where
    torch would emulate every bf16 product; a recipe without bf16 never gets it."""
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    asks = RunConfig(steps=1, bf16=True)
    monkeypatch.setattr(loop, "cpu_has_bf16", lambda: True)
    assert bf16_here(asks, "cpu") and not bf16_here(RunConfig(steps=1), "cpu")
    assert training_forward(layer, asks)(x).dtype == torch.bfloat16
    monkeypatch.setattr(loop, "cpu_has_bf16", lambda: False)
    assert not bf16_here(asks, "cpu")
    assert training_forward(layer, asks)(x).dtype == torch.float32
