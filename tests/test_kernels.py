"""Batched verification: the Triton kernels equal the torch reference exactly, and are lossless.

On a machine without CUDA the kernels run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1, set
by conftest.py before anything imports triton); on a CUDA machine (scripts/device_check.sh) the same tests compile them
for the GPU. The interpreter runs one Python call per program, so the batches here are small.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from specdec_lab.kernels import BatchRandoms, draw_randoms, pick_backend, reference, verify_batch
from specdec_lab.kernels import triton_verify as kernels
from specdec_lab.sampling import SamplingConfig, process_logits
from specdec_lab.verify import verify_greedy

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def ragged_batch(seed: int, counts: list[int], vocab: int, match_share: float = 0.6):
    """A flat batch: drafts that copy the target's argmax with probability `match_share`, random otherwise.

    Returns (draft_tokens, cu_num_draft, target_logits, draft_probs) on DEVICE; q is a softmax of its own.
    """
    gen = torch.Generator().manual_seed(seed)
    counts_t = torch.tensor(counts)
    cu = counts_t.cumsum(0)
    total, batch = int(cu[-1]), len(counts)
    logits = torch.randn(total + batch, vocab, generator=gen) * 3
    rows = torch.arange(total) + torch.repeat_interleave(torch.arange(batch), counts_t)
    copy = torch.rand(total, generator=gen) < match_share
    drafts = torch.where(copy, logits[rows].argmax(-1), torch.randint(0, vocab, (total,), generator=gen))
    q = torch.softmax(torch.randn(total, vocab, generator=gen) * 2, -1)
    return drafts.to(DEVICE), cu.to(DEVICE), logits.to(DEVICE), q.to(DEVICE)


COUNTS = [[3, 0, 1, 4, 2], [1], [0, 0], [4, 4, 4]]


@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("vocab", [37, 300])
def test_greedy_kernel_equals_the_reference(counts, vocab, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_V", 64)  # several vocabulary blocks even for a small vocabulary
    for seed in range(2):
        drafts, cu, logits, _ = ragged_batch(seed, counts, vocab)
        expected = reference.greedy_verify(drafts, cu, logits)
        got = kernels.greedy_verify(drafts, cu, logits)
        assert torch.equal(got.accepted, expected.accepted) and torch.equal(got.next_tokens, expected.next_tokens)


def test_greedy_reference_agrees_with_the_single_sequence_rule():
    drafts, cu, logits, _ = ragged_batch(3, [3, 0, 1, 4, 2], 37)
    verdict = reference.greedy_verify(drafts, cu, logits)
    start = 0
    for b, end in enumerate(cu.tolist()):
        single = verify_greedy(drafts[start:end], logits[start + b : end + b + 1])
        assert (int(verdict.accepted[b]), int(verdict.next_tokens[b])) == (single.accepted, single.next_token)
        start = end


@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_rejection_kernel_equals_the_reference_given_the_same_randoms(counts, deterministic, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_V", 16)
    vocab = 50
    config = SamplingConfig(temperature=0.8, top_k=20)  # top-k leaves exact zeros (and ties) in p and q
    kept = []
    for seed in range(3):
        drafts, cu, logits, q_logits = ragged_batch(seed, counts, vocab)
        p = process_logits(logits, config)
        q = None if deterministic else process_logits(torch.log(q_logits), config)
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        randoms = draw_randoms(len(drafts), len(cu), vocab, gen, DEVICE)
        expected = reference.rejection_verify(drafts, cu, p, q, randoms.uniforms, randoms.race)
        got = kernels.rejection_verify(drafts, cu, p, q, randoms.uniforms, randoms.race)
        assert torch.equal(got.accepted, expected.accepted) and torch.equal(got.next_tokens, expected.next_tokens)
        kept += expected.accepted.tolist()
    if sum(counts) >= 6 and not deterministic:  # the comparison covered both outcomes of the accept test
        assert 0 < sum(kept) < 3 * sum(counts)


def test_rejection_kernel_matches_the_reference_when_the_residual_is_empty():
    """p == q: no token can be rejected unless u hits exactly 1; force rejections with u = 1 and check the
    fallback to p agrees."""
    vocab = 20
    p = torch.softmax(torch.randn(3 + 1, vocab, generator=torch.Generator().manual_seed(0)), -1).to(DEVICE)
    drafts, cu = torch.tensor([1, 2, 3], device=DEVICE), torch.tensor([3], device=DEVICE)
    race = draw_randoms(3, 1, vocab, torch.Generator(device=DEVICE).manual_seed(1), DEVICE).race
    uniforms = torch.ones(3, device=DEVICE)
    expected = reference.rejection_verify(drafts, cu, p, p[:3].clone(), uniforms, race)
    got = kernels.rejection_verify(drafts, cu, p, p[:3].clone(), uniforms, race)
    assert int(expected.accepted[0]) == 0 and torch.equal(got.next_tokens, expected.next_tokens)
    assert int(expected.next_tokens[0]) == int((p[0] * race[0]).argmax())


def test_verify_batch_dispatches_and_both_backends_agree():
    drafts, cu, logits, q = ragged_batch(5, [2, 3, 0], 40)
    assert pick_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        pick_backend("cuda-graphs", torch.device("cpu"))
    for config in (SamplingConfig(0.0), SamplingConfig(1.0, top_p=0.9)):
        verdicts = [verify_batch(drafts, cu, logits, config, q, generator=torch.Generator(DEVICE).manual_seed(0),
                                 backend=backend) for backend in ("torch", "triton")]
        assert torch.equal(verdicts[0].accepted, verdicts[1].accepted)
        assert torch.equal(verdicts[0].next_tokens, verdicts[1].next_tokens)
    emitted = verdicts[0].emitted(drafts, cu)
    assert [len(e) for e in emitted] == [a + 1 for a in verdicts[0].accepted.tolist()]


def test_verify_batch_rejects_a_malformed_layout_with_clear_errors():
    drafts, cu, logits, q = ragged_batch(0, [2, 3], 10)
    greedy = SamplingConfig(0.0)
    with pytest.raises(ValueError, match="target rows"):
        verify_batch(drafts, cu, logits[:-1], greedy)
    with pytest.raises(ValueError, match="end at len"):
        verify_batch(drafts, cu - 1, logits, greedy)
    with pytest.raises(ValueError, match="integer"):
        verify_batch(drafts.float(), cu, logits, greedy)
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        verify_batch(drafts, cu, logits, SamplingConfig(1.0), q[:-1])
    with pytest.raises(ValueError, match="randoms must hold"):
        verify_batch(drafts, cu, logits, SamplingConfig(1.0), q, randoms=BatchRandoms(torch.rand(1), torch.rand(2, 10)))


# --- Losslessness through the kernel ----------------------------------------------------------------------------

P_ROWS = torch.tensor([[0.50, 0.30, 0.15, 0.05], [0.10, 0.20, 0.30, 0.40], [0.25, 0.25, 0.25, 0.25]])
Q_ROWS = torch.tensor([[0.05, 0.15, 0.30, 0.50], [0.40, 0.30, 0.20, 0.10]])


def run_kernel_many(sequences: int, seed: int, residual=kernels.residual_of):
    """`sequences` independent copies of one k = 2 verification (a context-free target: p rows P_ROWS, draft
    tokens sampled from Q_ROWS), verified by the kernel in ONE call. Returns the (B,) verdict and the drafts."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(Q_ROWS, 1, generator=gen)[:, 0] for _ in range(sequences)])
    cu = torch.full((sequences,), 2).cumsum(0)
    p = P_ROWS.repeat(sequences, 1)
    q = Q_ROWS.repeat(sequences, 1)
    randoms = draw_randoms(2 * sequences, sequences, 4, gen)
    verdict = kernels.rejection_verify(drafts.reshape(-1).to(DEVICE), cu.to(DEVICE), p.to(DEVICE), q.to(DEVICE),
                                       randoms.uniforms.to(DEVICE), randoms.race.to(DEVICE), residual=residual)
    return verdict, drafts


def emitted_pvalues(verdict, drafts, chi_square) -> tuple[float, float]:
    """Chi-square p-values of the first emitted token against p_0, and of the second (where the first draft
    token was kept) against p_1."""
    accepted, nexts = verdict.accepted.cpu(), verdict.next_tokens.cpu()
    first = torch.where(accepted >= 1, drafts[:, 0], nexts)
    kept = accepted >= 1
    second = torch.where(accepted[kept] >= 2, drafts[kept, 1], nexts[kept])
    return (chi_square(torch.bincount(first, minlength=4), P_ROWS[0]),
            chi_square(torch.bincount(second, minlength=4), P_ROWS[1]))


def test_rejection_kernel_is_lossless_chi_square(chi_square):
    verdict, drafts = run_kernel_many(300, seed=0)
    first, second = emitted_pvalues(verdict, drafts, chi_square)
    assert first > 1e-3 and second > 1e-3


@triton.jit
def p_instead_of_residual(p, q):
    """A wrong residual: the correction is drawn from p itself, ignoring what the draft already covered."""
    return tl.maximum(p, 0.0 * q)


def test_a_kernel_with_a_broken_residual_fails_the_same_chi_square_test(chi_square):
    """Control: a kernel that resamples from p instead of norm(max(0, p - q)) must fail the test above."""
    verdict, drafts = run_kernel_many(300, seed=0, residual=p_instead_of_residual)
    first, _ = emitted_pvalues(verdict, drafts, chi_square)
    assert first < 1e-4
