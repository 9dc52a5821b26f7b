"""Loading causal LMs: any Hugging Face folder or hub id, and the shipped zoo pair.

Models load in fp32 on CPU (the zoo stores fp16 weights, upcast here) and in fp16 on CUDA, in eval mode.
The tokenizer is looked up in the model folder first, then in a sibling `tokenizer/` folder (zoo layout).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

# The zoo loads in milliseconds; per-shard progress bars would only clutter notebooks and the CLI.
hf_logging.disable_progress_bar()

ZOO_ROOT = Path(__file__).parent / "zoo"
DEFAULT_ZOO = "stdlib-14m"


def folder_digest(*folders: str | Path) -> str:
    """A short hash of every file in `folders` (names and contents): names a model's exact weights."""
    hasher = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                hasher.update(path.name.encode() + path.read_bytes())
    return hasher.hexdigest()[:12]


@dataclass
class ModelPair:
    """A target, a draft that shares its tokenizer, and that tokenizer."""

    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase


def available_devices() -> list[str]:
    """The devices torch can use on this machine, in words: "cpu", then "cuda:0" ... and "mps" where present."""
    found = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return found + (["mps"] if torch.backends.mps.is_available() else [])


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """`device` if given (checked: a device this machine has), else CUDA when present, else CPU.

    device: "cpu", "cuda", "cuda:1", "mps", a torch.device, or None. Raises ValueError naming the device asked for
    and the ones available when this machine (or this build of torch) has no such device.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"unknown device {device!r}: {error}; this machine has {', '.join(available_devices())}") \
            from None
    build = f"torch {torch.__version__}"
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            why = "no CUDA device is visible" if torch.backends.cuda.is_built() else f"{build} is built without CUDA"
            raise ValueError(f"device {str(device)!r} asked for, but {why} on this machine; it has "
                             f"{', '.join(available_devices())} (pass device='cpu', or None to choose)")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} asked for, but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s): {', '.join(available_devices())}")
    elif chosen.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(device)!r} asked for, but {build} has no usable MPS (Apple GPU) device here; "
                         f"this machine has {', '.join(available_devices())}")
    return chosen


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def pick_dtype(device: torch.device, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """`dtype` if given (a torch dtype or a name such as "bf16"), else fp16 on CUDA and fp32 on CPU (CPU
    half-precision matmuls are slow)."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch dtype or one of {', '.join(DTYPES)}, got {dtype!r}")
        return dtype
    return torch.float16 if device.type == "cuda" else torch.float32


def zoo_path(name: str = DEFAULT_ZOO) -> Path:
    """The folder of a shipped zoo (it holds `tokenizer/`, `target/`, `draft/` and head folders)."""
    return ZOO_ROOT / name


def unreadable_weights(folder: str | os.PathLike) -> list[tuple[Path, str]]:
    """The `*.safetensors` files of `folder` that safetensors cannot open (truncated, or not safetensors at all),
    each with safetensors' own reason; [] when every file opens (or the folder has none)."""
    bad = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            bad.append((path, str(error)))
    return bad


def corrupt_weights_message(source: str, error: Exception) -> str:
    """What to tell a user whose model folder holds weights safetensors cannot read: which file, its size, why,
    and how to get a good copy back."""
    folder = Path(source)
    bad = unreadable_weights(folder) if folder.is_dir() else []
    if not bad:
        return (f"could not read the weights of {source!r}: {error}. The model's safetensors file is truncated or "
                "corrupt: download or copy it again")
    files = "; ".join(f"{path} ({path.stat().st_size:,} bytes): {reason}" for path, reason in bad)
    if folder.resolve().is_relative_to(ZOO_ROOT.resolve()):
        fix = ("It belongs to the shipped zoo: restore it with `git checkout -- <file>` (or `git status` to see "
               "what changed), or rebuild the zoo with `specdec train all`")
    else:
        fix = "Copy or download it again (an interrupted copy or a full disk leaves a file like this)"
    return f"the model weights are truncated or corrupt: {files}. {fix}"


def _load_tokenizer(path: Path | str) -> PreTrainedTokenizerBase:
    local = Path(path)
    if local.is_dir() and not (local / "tokenizer_config.json").exists() and (local.parent / "tokenizer").is_dir():
        local = local.parent / "tokenizer"
        return AutoTokenizer.from_pretrained(str(local))
    return AutoTokenizer.from_pretrained(str(path))


def load_model(path_or_id: str | os.PathLike, device: str | torch.device | None = None,
               dtype: torch.dtype | str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local folder or a hub id.

    path_or_id: a Hugging Face model folder (or hub id, when the network allows); device: where to put it
    (default: CUDA if present, else CPU; a device this machine lacks is refused, naming the ones it has); dtype:
    weight precision, a torch dtype or "fp32" / "fp16" / "bf16" (default: fp16 on CUDA, fp32 on CPU). Weights that
    safetensors cannot read (a truncated copy) are refused with a ValueError naming the file. Everything the engine
    creates during generation follows the model's device and dtype, so `load_pair(device="cuda", dtype="bf16")`
    needs no other change.
    """
    device = pick_device(device)
    source = str(path_or_id)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=pick_dtype(device, dtype))
        tokenizer = _load_tokenizer(source)
    except SafetensorError as error:
        raise ValueError(corrupt_weights_message(source, error)) from None
    except (OSError, ValueError) as error:
        where = "local folder" if Path(source).exists() else "not a local folder, and not fetchable as a hub id"
        raise FileNotFoundError(f"could not load a causal LM from {source!r}: {where}. Cause: {error}") from None
    return model.to(device).eval(), tokenizer


def load_pair(target: str | os.PathLike | None = None, draft: str | os.PathLike | None = None,
              device: str | torch.device | None = None, dtype: torch.dtype | str | None = None) -> ModelPair:
    """Load a target and a draft model (default: the shipped zoo pair, offline).

    target / draft: model folders or hub ids (None = the zoo's); device / dtype: as for `load_model`.
    """
    zoo = zoo_path()
    if target is None:
        target = zoo / "target"
        draft = zoo / "draft" if draft is None else draft
        if not (Path(target) / "config.json").exists():
            raise FileNotFoundError(f"the zoo models are missing in {zoo}; build them with "
                                    "`specdec train all` (see the model card)")
    target_model, tokenizer = load_model(target, device, dtype)
    draft_model = None
    if draft is not None:
        draft_model, draft_tokenizer = load_model(draft, device, dtype)
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"draft {str(draft)!r} and target {str(target)!r} use different tokenizers; "
                             "speculative decoding needs a shared vocabulary")
    return ModelPair(target_model, draft_model, tokenizer)
