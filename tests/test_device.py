"""Device and dtype: the engine takes both from the model, so `load_pair(device="cuda", dtype="bf16")` just works.

No GPU is needed here: a static scan finds every tensor the library creates without saying where (each such
place must be on the allow-list below, with the reason it is host-side on purpose), and runs in bfloat16 show
that nothing assumes fp32. scripts/device_check.sh repeats the runtime checks on a CUDA device.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import specdec_lab
from specdec_lab import DraftModelDrafter, PromptLookupDrafter, generate, generate_batch, load_pair
from specdec_lab.models import pick_dtype

PACKAGE = Path(specdec_lab.__file__).parent
FACTORIES = {"tensor", "zeros", "ones", "arange", "empty", "full", "rand", "randn", "randint", "eye", "Generator"}

# (module, enclosing function): tensors built on the host on purpose.
HOST_SIDE = {
    ("tree.py", "slot_visibility"): "cached mask shape, moved to the tree's device by DraftTree.visibility",
    ("drafters/lookahead.py", "window_visibility"): "cached mask shape; the decode loop moves extra rows over",
    ("drafters/lookahead.py", "step_visibility"): "host mask, moved by decode.tree_inputs",
    ("drafters/lookahead.py", "step_offsets"): "host offsets, moved by decode.tree_inputs",
    ("drafters/lookahead.py", "start"): "seeds the initial window from a host generator (Python ints out)",
    ("drafters/medusa.py", "from_pretrained"): "an empty placeholder when no target is given",
    ("drafters/medusa.py", "tree_shape"): "cached tree shape, indices moved to the logits' device when used",
    ("drafters/prompt_lookup.py", "propose"): "n-gram search on the host; the draft is moved to state.device",
    ("viz.py", "*"): "plotting works on host copies",
    ("widgets/tree_view.py", "*"): "widgets work on host copies",
    ("train/*", "*"): "training and model-card code: token streams, counters and CPU timings on the host",
    ("batch_bench.py", "verify_cost"): "seeded random ids drawn on the host (same on every device), then moved",
    ("kernels/bench.py", "random_batch"): "seeded random batch drawn on the host (same on every device), then moved",
}


def allowed(module: str, function: str) -> bool:
    for (mod, fn) in HOST_SIDE:
        module_ok = mod == module or (mod.endswith("/*") and module.startswith(mod[:-1]))
        if module_ok and fn in ("*", function):
            return True
    return False


def tensors_without_device() -> list[str]:
    """`module:line (function)` of every torch factory call without a device= argument, outside the allow-list."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
            for call in ast.walk(function):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"
                        and call.func.attr in FACTORIES):
                    continue
                if any(k.arg == "device" for k in call.keywords) or allowed(module, function.name):
                    continue
                found.append(f"{module}:{call.lineno} ({function.name})")
    return sorted(set(found))


def test_every_tensor_the_engine_creates_takes_its_device_from_the_model():
    assert tensors_without_device() == []


def test_the_scan_finds_a_tensor_made_without_a_device(tmp_path, monkeypatch):
    (tmp_path / "decode.py").write_text("import torch\n\ndef step(ids):\n    return torch.tensor(ids)\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert tensors_without_device() == ["decode.py:4 (step)"]


def test_dtype_names_and_bad_dtypes():
    assert pick_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    assert pick_dtype(torch.device("cpu"), "float16") == torch.float16
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        pick_dtype(torch.device("cpu"), "int8")
    with pytest.raises(ValueError, match="floating-point torch dtype"):
        pick_dtype(torch.device("cpu"), torch.int64)


@pytest.fixture(scope="module")
def bf16_pair():
    return load_pair(device="cpu", dtype="bf16")


def test_the_zoo_runs_in_bfloat16_on_every_path(bf16_pair):
    """Nothing in the engine assumes fp32: every method and the batched path run on bf16 weights."""
    pair = bf16_pair
    assert next(pair.target.parameters()).dtype == torch.bfloat16
    assert next(pair.draft.parameters()).dtype == torch.bfloat16
    ids = pair.tokenizer("def is_prime(n):\n", add_special_tokens=False)["input_ids"]
    for temperature in (0.0, 1.0):
        plain = generate(pair.target, ids, max_new_tokens=12, temperature=temperature, eos_token_id=-1)
        draft = generate(pair.target, ids, drafter=DraftModelDrafter(pair.draft, k=4), max_new_tokens=12,
                         temperature=temperature, eos_token_id=-1)
        lookup = generate(pair.target, ids, drafter=PromptLookupDrafter(), max_new_tokens=12,
                          temperature=temperature, eos_token_id=-1)
        batch = generate_batch(pair.target, [ids, ids[:3]], drafter=DraftModelDrafter(pair.draft, k=4),
                               max_new_tokens=12, temperature=temperature, eos_token_id=-1)
        for tokens in (plain.tokens, draft.tokens, lookup.tokens, *batch.tokens):
            assert len(tokens) == 12 and all(0 <= t < pair.target.config.vocab_size for t in tokens)
    assert draft.stats.accepted > 0
