"""The zoo recipe: every hyper-parameter of every shipped model, stored as JSON next to the weights.

One file reproduces the whole zoo (`specdec train all --recipe <file>`). Stages that later code adds (Medusa,
EAGLE heads, MTP modules) keep their own section in the same file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class ModelShape:
    """Size of one Llama model."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 1024


@dataclass
class RunConfig:
    """Optimisation settings of one training stage."""

    steps: int
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 50
    # Mixed precision: the forward and backward passes under bf16 autocast, weights and optimizer state in
    # fp32 (about 1.8x faster per step on a CPU with AMX). Where the device has no bf16 kernels the run computes in
    # fp32 instead (train.loop.bf16_here): emulated bf16 is several times slower than fp32.
    bf16: bool = False
    # torch.compile the training forward (inductor): another ~1.3x here, after a compile of a minute or two.
    compile: bool = False
    # An evaluation figure (higher is better) that picks the exported weights: the best evaluation's
    # weights are kept beside the checkpoint and exported instead of the last step's (None: the last step).
    select_by: str | None = None


@dataclass
class TargetOutputs:
    """The target-written training text that the draft and the heads also learn from.

    prompts: how many training-split function prompts the target completes; new_tokens: greedy tokens per
    completion; max_prompt_tokens: prompts are cut to their last this many tokens; batch_size: prompts per
    generation batch; share: fraction of each draft/head training batch drawn from this text (the rest is corpus).
    """

    prompts: int = 4096
    new_tokens: int = 128
    max_prompt_tokens: int = 160
    batch_size: int = 64
    share: float = 0.5


def section_with_run(cls, data: dict):
    """A recipe section of dataclass `cls` read from its JSON dict: its "run" entry becomes a `RunConfig`, and
    whatever the dict leaves out takes the dataclass's default."""
    data = dict(data)
    if "run" in data:
        data["run"] = RunConfig(**data["run"])
    return cls(**data)


@dataclass
class MTPRecipe:
    """The "mtp" section: multi-token prediction modules (DeepSeek-V3) on the frozen target.

    num_modules: K, one module per draft depth; loss_decay: depth d's loss weighs loss_decay^(d-1) (as Medusa's
    heads); init_from_layer: target layer every module's decoder layer starts from (None = random); run:
    optimiser settings (the same data and batch shapes as the EAGLE heads).
    """

    num_modules: int = 3
    loss_decay: float = 0.8
    init_from_layer: int | None = -1
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=300, batch_size=4, seq_len=256, lr=1e-3,
                                                             warmup_steps=20, eval_every=50, eval_batches=2,
                                                             checkpoint_every=25))

    @classmethod
    def from_dict(cls, data: dict) -> MTPRecipe:
        """Read the section (its "run" becomes a `RunConfig`)."""
        return section_with_run(cls, data)


@dataclass
class LoopUnlikelihood:
    """The "target_tune" section: the target's second phase, a fine-tune against its own loops
    (`train.unlikelihood`, sequence-level unlikelihood).

    prompt_pool: the first this many training-split function prompts (fewer where the split has fewer), from
    which each step draws; prompts_per_step: prompts the model completes greedily at each step; new_tokens: tokens per
    completion; max_prompt_tokens: prompts are cut to their last this many tokens; min_loop_tokens: a completion
    token is pushed down when it carries a loop (one token, or a cycle of 2 to 4) to this many tokens or more;
    max_loop_period / loop_copies: the loops so treated are cycles of up to this many tokens, from the token
    after this many whole copies of the cycle (4 / 1: the short loops above; 32 / 2: also a statement or two
    written a third time in a row, see `quality.repeats_itself`); weight: the unlikelihood loss's weight beside
    the next-token loss; run: optimiser settings (its batch shape is the corpus batch of the next-token loss).
    """

    prompt_pool: int = 8192
    prompts_per_step: int = 16
    new_tokens: int = 64
    max_prompt_tokens: int = 160
    min_loop_tokens: int = 8
    max_loop_period: int = 4
    loop_copies: int = 1
    weight: float = 1.0
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=200, lr=3e-4, warmup_steps=20, eval_every=50,
                                                             select_by="selection_clean_share"))

    @classmethod
    def from_dict(cls, data: dict) -> LoopUnlikelihood:
        """Read the section (its "run" becomes a `RunConfig`)."""
        return section_with_run(cls, data)


@dataclass
class ZooRecipe:
    """Everything needed to rebuild a zoo folder from scratch."""

    name: str
    vocab_size: int = 4096
    val_percent: int = 5
    # Train the target and the draft on the library's test suites too (the tokenizer stays library-only).
    test_folders: bool = False
    # Deep and narrow target, one-layer draft: at this size a CPU forward's cost follows the layer count
    # (per-layer overhead), so these shapes give the ~10x target/draft cost ratio that speculation needs.
    target: ModelShape = field(default_factory=lambda: ModelShape(256, 16, 4, 704))
    draft: ModelShape = field(default_factory=lambda: ModelShape(128, 1, 2, 384))
    target_run: RunConfig = field(default_factory=lambda: RunConfig(steps=1400))
    # The target's second phase, against its own greedy loops (None: pre-training only).
    target_tune: LoopUnlikelihood | None = None
    draft_run: RunConfig = field(default_factory=lambda: RunConfig(steps=600, lr=3e-3))
    # Second draft phase, on a mix of corpus and target outputs (None: corpus distillation only).
    draft_tune_run: RunConfig | None = None
    target_outputs: TargetOutputs = field(default_factory=TargetOutputs)
    # The target-written text of the draft's second phase, where it differs from the heads' (None: the same).
    draft_target_outputs: TargetOutputs | None = None
    # The draft distils the target's distribution divided by this temperature (below 1: sharpened toward the
    # target's top token, which greedy acceptance rewards; 1: plain forward KL).
    draft_teacher_temperature: float = 1.0
    # Held-out prompts on which the draft stage measures greedy acceptance (k = 4, 64 new tokens) after each
    # phase, so the card shows what the second phase bought (0: skip the measurement).
    phase_check_prompts: int = 100
    # Sections owned by other stages (e.g. "medusa", "eagle"): kept verbatim, read by their own code.
    extra: dict = field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        """Write the recipe as indented JSON."""
        data = asdict(self)
        data.update(data.pop("extra"))
        Path(path).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ZooRecipe:
        """Read a recipe written by `save` (unknown sections land in `extra`)."""
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)} - {"extra"}
        extra = {k: v for k, v in data.items() if k not in known}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key, typ in (("target", ModelShape), ("draft", ModelShape)):
            if key in kwargs:
                kwargs[key] = typ(**kwargs[key])
        for key in ("target_run", "draft_run", "draft_tune_run"):
            if kwargs.get(key) is not None:
                kwargs[key] = RunConfig(**kwargs[key])
        if kwargs.get("target_tune") is not None:
            kwargs["target_tune"] = LoopUnlikelihood.from_dict(kwargs["target_tune"])
        for key in ("target_outputs", "draft_target_outputs"):
            if kwargs.get(key) is not None:
                kwargs[key] = TargetOutputs(**kwargs[key])
        return cls(**kwargs, extra=extra)
