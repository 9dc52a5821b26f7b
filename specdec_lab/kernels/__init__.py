"""Batched verification: a torch reference (the CPU path) and Triton kernels (the GPU path), one contract.

    verdict = verify_batch(draft_tokens, cu_num_draft, target_logits, sampling, draft_probs, generator=g)
    verdict.accepted, verdict.next_tokens          # (B,) each

`verify_batch` dispatches to the Triton kernels for CUDA tensors and to the torch reference elsewhere; given the
same randoms both pick the same tokens (layout and random stream: `specdec_lab.kernels.layout`). Temperature,
top-k and top-p stay in torch (`specdec_lab.sampling.process_logits`), applied identically to p and q before
verification. The Triton module is imported only when used, so the engine runs where Triton is absent.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from specdec_lab.kernels import reference
from specdec_lab.kernels.layout import BatchRandoms, BatchVerdict, check_layout, draft_starts, draw_randoms
from specdec_lab.sampling import SamplingConfig, process_logits

BACKENDS = ("auto", "torch", "triton")


def triton_available() -> bool:
    """Whether the `triton` package is installed (it still needs CUDA, or TRITON_INTERPRET=1 on CPU)."""
    return importlib.util.find_spec("triton") is not None


def pick_backend(backend: str, device: torch.device) -> str:
    """Resolve "auto" to "triton" on CUDA (when installed) and "torch" elsewhere; check explicit choices."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "triton" and not triton_available():
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the Triton kernels need CUDA tensors (got {device.type}); to run them on CPU through "
                         "Triton's interpreter, set TRITON_INTERPRET=1 before anything imports triton")
    return backend


def implementation(backend: str):
    """The module that implements `greedy_verify` / `rejection_verify` for a resolved backend."""
    if backend == "triton":
        from specdec_lab.kernels import triton_verify

        return triton_verify
    return reference


def verify_batch(draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor, target_logits: torch.Tensor,
                 sampling: SamplingConfig, draft_probs: torch.Tensor | None = None,
                 randoms: BatchRandoms | None = None, generator: torch.Generator | None = None,
                 backend: str = "auto") -> BatchVerdict:
    """Verify a batch of ragged drafts against the target's logits in one call.

    draft_tokens: (T,) every sequence's draft, concatenated; cu_num_draft: (B,) inclusive cumulative draft
    counts; target_logits: (T + B, V) raw target logits, k_b + 1 rows per sequence; sampling: temperature /
    top-k / top-p (temperature 0 = greedy matching, no randomness); draft_probs: (T, V) the processed q each
    draft token was sampled from, or None for deterministic drafts (q = one-hot); randoms: the uniforms and race
    weights to use (default: drawn from `generator`); generator: the run's random source; backend: "auto"
    (Triton on CUDA, torch elsewhere), "torch" or "triton".
    """
    check_layout(draft_tokens, cu_num_draft, target_logits, draft_probs, randoms)
    chosen = implementation(pick_backend(backend, target_logits.device))
    if sampling.greedy:
        return chosen.greedy_verify(draft_tokens, cu_num_draft, target_logits)
    target_probs = process_logits(target_logits, sampling)
    if randoms is None:
        randoms = draw_randoms(len(draft_tokens), len(cu_num_draft), target_logits.shape[-1], generator,
                               target_logits.device)
    draft_probs = draft_probs.float() if draft_probs is not None else None
    return chosen.rejection_verify(draft_tokens, cu_num_draft, target_probs, draft_probs, randoms.uniforms,
                                   randoms.race)


__all__ = ["BatchRandoms", "BatchVerdict", "draft_starts", "draw_randoms", "pick_backend", "triton_available",
           "verify_batch"]
