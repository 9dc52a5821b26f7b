"""Checks of lab 1 (speculative sampling). Visible checks repeat the notebook's own cases; hidden ones draw new
cases from the run's generator and aim at the classic mistakes (p/q swapped, residual not clipped or not
normalised, the bonus token missing or drawn from the wrong row, a histogram that does not converge to p).

No input holds an expected value: every judge computes what is expected from the reference, or tests the
distribution of what came back. Sampled answers are tested as samples (the bonus token over many calls, with a
random last row of p), so no answer can be derived from the inputs without the method; the histogram is also run
with a broken `verify` and must follow it, so a histogram sampled from p without `verify` fails."""

from __future__ import annotations

import itertools

import torch

from autograder.checks._common import (
    Check,
    Fail,
    as_int,
    as_ints,
    chi_square_pvalue,
    decode,
    distributions,
    fixed,
    histogram,
    histogram_run,
    require,
    require_close,
    require_follows_broken_rule,
    show,
)

P_VALUE = 1e-6  # an honest solution fails a statistical check with this probability (per check)


def judge_tensors(function: str, *arguments: str):
    """A judge comparing each case's answer with the reference `function` applied to the same case."""
    def judge(inputs: dict, answers: list, ref: dict) -> None:
        for case, answer in zip(inputs["cases"], answers, strict=True):
            args = [torch.tensor(case[a]) if isinstance(case[a], list) else case[a] for a in arguments]
            expected = ref[function](*args)
            shown = ", ".join(f"{a}={show(case[a]) if not isinstance(case[a], list) else 'tensor'}"
                              for a in arguments)
            require_close(answer, expected, f"{function}({shown})")
    return judge


def process_cases(generator: torch.Generator, ref: dict) -> dict:
    logits = torch.randn(3, 7, generator=generator)
    settings = [(0.5, None), (2.0, None), (1.0, 2), (0.7, 3), (0.0, None)]
    return {"cases": [{"logits": logits.tolist(), "temperature": t, "top_k": k} for t, k in settings]}


def residual_cases(generator: torch.Generator, ref: dict) -> dict:
    p, q = distributions(2, 9, generator)
    return {"cases": [{"p": p.tolist(), "q": q.tolist()}, {"p": p.tolist(), "q": p.tolist()}]}


def count_cases(generator: torch.Generator, ref: dict) -> dict:
    p = torch.tensor([[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]])
    q = torch.tensor([[0.8, 0.2], [0.1, 0.9], [0.5, 0.5]])
    cases = [  # p/q = 0.25 rejected by u = 0.5; a rejection at position 1 stops the count; p >= q always kept
        {"tokens": [0, 0, 0], "p": p.tolist(), "q": q.tolist(), "u": [0.5, 0.5, 0.5]},
        {"tokens": [1, 1, 0], "p": p.tolist(), "q": q.tolist(), "u": [0.9, 0.5, 0.1]},
        {"tokens": [1, 0, 1], "p": p.tolist(), "q": q.tolist(), "u": [0.99, 0.99, 0.99]},
    ]
    for _ in range(6):
        p, q = distributions(4, 5, generator), distributions(4, 5, generator)
        tokens = torch.multinomial(q, 1, generator=generator)[:, 0]
        cases.append({"tokens": tokens.tolist(), "p": p.tolist(), "q": q.tolist(),
                      "u": torch.rand(4, generator=generator).tolist()})
    return {"cases": cases}


def judge_counts(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["accepted_count"](torch.tensor(case["tokens"]), torch.tensor(case["p"]),
                                         torch.tensor(case["q"]), torch.tensor(case["u"]))
        got = as_int(answer)
        ratios = [round(case["p"][i][t] / case["q"][i][t], 3) for i, t in enumerate(case["tokens"])]
        require(got == expected, f"draft {case['tokens']} with p/q ratios {ratios} and u = {show(case['u'])}: "
                                 f"expected {expected} accepted, got {got}")


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().sum() / 2)


def far_apart(rows: int, vocab: int, generator: torch.Generator, gap: float = 0.3) -> torch.Tensor:
    """`rows` random distributions whose last two are at least `gap` apart in total variation, so that a sample
    from the wrong one of them is told from the right one with certainty (in practice) by a chi-square test."""
    while True:
        drawn = distributions(rows, vocab, generator)
        if total_variation(drawn[-1], drawn[-2]) >= gap:
            return drawn


BONUS_REPEATS = 400  # calls of verify per bonus case: the bonus token's distribution is tested over them


def bonus_cases(generator: torch.Generator, ref: dict) -> dict:
    """Drafts of k = 1 .. 4 tokens drawn from random q rows, with p equal to q there (so every drafted token is
    accepted whatever u is) and a random last row p[k]: the bonus token is a sample from p[k], not a value that
    can be read off the inputs, and p[k] is far from p[k - 1] (the classic wrong row)."""
    cases = []
    for k in range(1, 5):
        rows = far_apart(k + 1, 8, generator)
        q = rows[:k]
        p = torch.cat([q, rows[-1:]])
        draft = torch.multinomial(q, 1, generator=generator)[:, 0]
        cases.append({"tokens": draft.tolist(), "p": p.tolist(), "q": q.tolist(), "n": BONUS_REPEATS,
                      "seed": int(torch.randint(0, 2**31, (1,), generator=generator))})
    return {"cases": cases}


def judge_bonus(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        k, draft, bonus_row = len(case["tokens"]), case["tokens"], torch.tensor(case["p"][-1])
        label = f"a draft {draft} of {k} tokens where p equals q (every token accepted)"
        emitted = decode(answer)
        require(isinstance(emitted, list) and len(emitted) == case["n"],
                f"{label}, verified {case['n']} times: expected {case['n']} results, got {show(emitted)}")
        bonus = []
        for got in emitted:
            got = as_ints(got)
            require(len(got) == k + 1 and got[:k] == draft, f"{label}: expected the {k} drafted tokens followed by "
                                                            f"exactly one bonus token, got {got}")
            bonus.append(got[k])
        counts = histogram(bonus, len(bonus_row))
        pvalue = chi_square_pvalue(counts, bonus_row)
        require(pvalue > P_VALUE, f"{label}: over {case['n']} calls the bonus token is not distributed as p[{k}] = "
                                  f"{show(bonus_row)} (chi-square p-value {pvalue:.1e}); observed "
                                  f"{show(counts / case['n'])}")


REJECTION_P = [[0.4, 0.3, 0.3, 0.0], [0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0]]
REJECTION_Q = [[0.4, 0.3, 0.3, 0.0], [0.5, 0.0, 0.5, 0.0]]


def rejection_inputs(generator: torch.Generator, ref: dict) -> dict:
    p0, q0 = distributions(2, 5, generator, sharpness=1.5)
    cases = [{"tokens": [2, 0], "p": REJECTION_P, "q": REJECTION_Q, "seed": s} for s in range(20)]
    return {"cases": cases, "first": {"p": p0.tolist(), "q": q0.tolist(), "n": 3000,
                                      "seed": int(torch.randint(0, 2**31, (1,), generator=generator))}}


def judge_rejection(inputs: dict, answer: dict, ref: dict) -> None:
    for got in answer["cases"]:
        got = as_ints(got)
        require(got == [2, 1], "a draft [2, 0] whose token 0 has p = 0 at position 1 (always rejected; the "
                               f"residual there puts all its mass on token 1): expected [2, 1], got {got}")
    p = torch.tensor(inputs["first"]["p"])
    counts = histogram(as_ints(answer["first"]), len(p))
    n = inputs["first"]["n"]
    pvalue = chi_square_pvalue(counts, p)
    require(pvalue > P_VALUE, f"over {n} one-token drafts from q, the first emitted token is not distributed as p "
                              f"(chi-square p-value {pvalue:.1e}): p = {show(p)}, observed {show(counts / n)}")


def histogram_cases(generator: torch.Generator, ref: dict) -> dict:
    """Random p and q over 6 tokens, far apart (so that counts following q are never mistaken for p)."""
    p, q = far_apart(2, 6, generator)
    return {"cases": [{"p": p.tolist(), "q": q.tolist(), "n": 4000,
                       "seed": int(torch.randint(0, 2**31, (1,), generator=generator))}]}


# How the messages name the broken verification the histogram probe also runs.
BROKEN_RULE = "verify replaced by one that accepts every drafted token"


def histogram_counts(case: dict, answer, broken: bool) -> torch.Tensor:
    """The counts of the real run, or (`broken`) of the run with the broken rule."""
    return histogram_run(case, answer, broken, BROKEN_RULE)


def require_follows_verify(case: dict, answer) -> None:
    """The run with the broken rule follows q (a histogram counts what `verify` emits)."""
    require_follows_broken_rule(case, answer, BROKEN_RULE, "verify", P_VALUE)


def judge_histogram(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        counts, p = histogram_counts(case, answer, broken=False), torch.tensor(case["p"])
        pvalue = chi_square_pvalue(counts, p)
        if pvalue <= P_VALUE:
            raise Fail(f"your histogram of n = {case['n']} draws does not match p (chi-square p-value "
                       f"{pvalue:.1e}): p = {show(p)}, observed {show(counts / case['n'])}")
        require_follows_verify(case, answer)


def judge_verify_visible(inputs: dict, answers: list, ref: dict) -> None:
    """The visible cases have one possible outcome each; the reference computes it with the same seed."""
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["verify"](torch.tensor(case["tokens"]), torch.tensor(case["p"]), torch.tensor(case["q"]),
                                 torch.Generator().manual_seed(case["seed"]))
        got = as_ints(answer)
        require(got == expected, f"verify(draft={case['tokens']}, p={show(case['p'])}, q={show(case['q'])}): "
                                 f"expected {expected}, got {got}")


def judge_histogram_visible(inputs: dict, answers: list, ref: dict) -> None:
    case = inputs["cases"][0]
    counts, p = histogram_counts(case, answers[0], broken=False), torch.tensor(case["p"])
    distance = total_variation(counts / case["n"], p)
    require(distance < 0.06, f"the histogram should approach p: total variation {distance:.3f} from p (expected "
                             "< 0.06)")
    require_follows_verify(case, answers[0])


# ----------------------------------------------------------------------------------------------- block verification


def repaying_case(generator: torch.Generator) -> dict:
    """A 2-token draft whose first token the target under-rates (r_1 < 1) and whose second it over-rates enough to
    repay it (r_1 r_2 >= 1), with a seed whose first uniform rejects token-wise: block verification keeps both."""
    while True:
        q = distributions(2, 5, generator, sharpness=1.0)
        p = distributions(3, 5, generator, sharpness=1.0)
        draft = [int(q[0].argmax()), int(q[1].argmin())]
        r1, r2 = float(p[0, draft[0]] / q[0, draft[0]]), float(p[1, draft[1]] / q[1, draft[1]])
        if r1 < 0.8 and r1 * r2 >= 1:
            break
    seed = next(s for s in itertools.count(int(torch.randint(0, 2**31, (1,), generator=generator)))
                if float(torch.rand(2, generator=torch.Generator().manual_seed(s))[0]) > r1)
    return {"tokens": draft, "p": p.tolist(), "q": q.tolist(), "seed": seed, "repays": True}


def seeds_where(condition, count: int, generator: torch.Generator) -> list[int]:
    """`count` seeds, from a random start, whose two uniforms torch.rand(2) satisfy `condition`."""
    start = int(torch.randint(0, 2**31, (1,), generator=generator))
    return list(itertools.islice((s for s in itertools.count(start)
                                  if condition(torch.rand(2, generator=torch.Generator().manual_seed(s)))), count))


# A draft the target likes twice as much as the draft at token 1 and half as much at token 2: w_1 = min(2, 1) = 1,
# w_2 = 0.5. With eta_2 >= 0.5 the block keeps one token; a weight left uncapped (2, then 1) keeps both.
CAPPED = {"tokens": [0, 0], "p": [[0.8, 0.2, 0.0], [0.2, 0.4, 0.4], [0.2, 0.3, 0.5]],
          "q": [[0.4, 0.3, 0.3], [0.4, 0.3, 0.3]]}
# w_1 = 0.5 and token 2 is impossible for the target (w_2 = 0): with eta_1 < h_1 = 1/6 the block keeps one token
# and samples max(0.5 p[1] - q[1], 0), all on token 1; the unscaled max(p[1] - q[1], 0) gives token 0 60% of the time.
SCALED = {"tokens": [0, 2], "p": [[0.25, 0.75, 0.0], [0.8, 0.2, 0.0], [0.2, 0.3, 0.5]],
          "q": [[0.5, 0.25, 0.25], [0.5, 0.0, 0.5]]}


def block_cases(generator: torch.Generator, ref: dict) -> dict:
    """Random drafts of k = 1 .. 4 tokens drawn from q (the block rule's weights, stop probabilities and scaled
    residual all matter), and two drafts that token-wise verification rejects at token 1 and the block keeps."""
    cases = []
    for k in (1, 2, 3, 4, 4):
        q, p = distributions(k, 6, generator, sharpness=1.5), distributions(k + 1, 6, generator, sharpness=1.5)
        draft = torch.multinomial(q, 1, generator=generator)[:, 0]
        cases.append({"tokens": draft.tolist(), "p": p.tolist(), "q": q.tolist(),
                      "seed": int(torch.randint(0, 2**31, (1,), generator=generator))})
    cases += [repaying_case(generator) for _ in range(2)]
    cases += [CAPPED | {"seed": s} for s in seeds_where(lambda eta: eta[1] >= 0.55, 3, generator)]
    cases += [SCALED | {"seed": s} for s in seeds_where(lambda eta: eta[0] < 0.15, 12, generator)]
    return {"cases": cases}


def judge_block(inputs: dict, answers: list, ref: dict) -> None:
    """Each answer equals the reference's verify_block with the same seed (the rule's draws are specified)."""
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, p, q = torch.tensor(case["tokens"]), torch.tensor(case["p"]), torch.tensor(case["q"])
        expected = ref["verify_block"](tokens, p, q, torch.Generator().manual_seed(case["seed"]))
        got = as_ints(answer)
        if got == expected:
            continue
        token_wise = ref["verify"](tokens, p, q, torch.Generator().manual_seed(case["seed"]))
        hint = (" That is what token-wise verification emits on these draws: the block rule's weight "
                "w_i = min(w_(i-1) r_i, 1) lets a later token repay an early one." if got == token_wise else "")
        raise Fail(f"verify_block(draft={case['tokens']}, p={show(p)}, q={show(q)}) with seed {case['seed']}: "
                   f"expected {expected}, got {got}.{hint}")


BLOCK_STEPS = 4000  # two-token drafts per lossless check: (first, second) token pairs over 4 x 4 cells


# Target and draft rows for the lossless check, found by search: at 4000 drafts an uncapped weight or an unscaled
# residual moves the emitted pairs far from p[0] x p[1] (chi-square p-values below 1e-20 in every trial), while
# block verification passes. Each student gets them with the 4 tokens relabelled at random.
LOSSLESS_P = [[0.022, 0.1784, 0.7857, 0.0139], [0.0898, 0.6028, 0.1977, 0.1097], [0.0178, 0.4486, 0.0435, 0.4901]]
LOSSLESS_Q = [[0.0719, 0.0482, 0.6493, 0.2306], [0.3368, 0.069, 0.2462, 0.348]]


def block_lossless_inputs(generator: torch.Generator, ref: dict) -> dict:
    """Two-token drafts from q, p's rows independent of the context, so the first two emitted tokens of a
    lossless rule are distributed as p[0] x p[1] (a step that emits one token is completed from p[1] here)."""
    order = torch.randperm(4, generator=generator)
    p, q = torch.tensor(LOSSLESS_P)[:, order], torch.tensor(LOSSLESS_Q)[:, order]
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    return {"p": p.tolist(), "q": q.tolist(), "n": BLOCK_STEPS,
            "seed": int(torch.randint(0, 2**31, (1,), generator=generator)),
            "secret": {"seed": int(torch.randint(0, 2**31, (1,), generator=generator))}}


def kept_share(drafts: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean number of leading emitted tokens equal to the draft's (a kept token, or a coincidence: the same
    measure for every rule)."""
    def leading(draft: list[int], out: list[int]) -> int:
        return next((i for i, (a, b) in enumerate(zip(draft, out, strict=False)) if a != b), min(len(draft), len(out)))

    return sum(leading(d, o) for d, o in zip(drafts, outputs, strict=True)) / len(drafts)


def judge_block_lossless(inputs: dict, answer, ref: dict) -> None:
    p, q, n = torch.tensor(inputs["p"]), torch.tensor(inputs["q"]), inputs["n"]
    got = decode(answer)
    require(isinstance(got, dict) and isinstance(got.get("drafts"), list) and isinstance(got.get("outputs"), list)
            and len(got["drafts"]) == len(got["outputs"]) == n, f"expected {n} verified drafts, got {show(got)}")
    drafts = [as_ints(d) for d in got["drafts"]]
    outputs = [as_ints(o) for o in got["outputs"]]
    require(all(len(d) == 2 for d in drafts) and all(1 <= len(o) <= 3 for o in outputs),
            "each two-token draft must give 1 to 3 emitted tokens")
    completion = torch.Generator().manual_seed(inputs["secret"]["seed"])
    pairs = torch.zeros(4, 4)
    for out in outputs:
        second = out[1] if len(out) > 1 else int(torch.multinomial(p[1], 1, generator=completion))
        pairs[out[0], second] += 1
    pvalue = chi_square_pvalue(pairs.flatten(), (p[0][:, None] * p[1][None, :]).flatten())
    require(pvalue > P_VALUE, f"over {n} two-token drafts, the first two emitted tokens are not distributed as "
                              f"p[0] x p[1] (chi-square p-value {pvalue:.1e}): the rule is not lossless")
    reference = [ref["verify_block"](torch.tensor(d), p, q, completion) for d in drafts]
    ours, theirs = kept_share(drafts, outputs), kept_share(drafts, reference)
    require(ours > theirs - 0.06, f"your verify_block kept {ours:.2f} drafted tokens per step on these drafts; block "
                                  f"verification keeps {theirs:.2f} (its emitted tokens must start with the kept "
                                  "prefix of the draft)")


LOGITS = [1.0, 3.0, 2.0, 0.5]
VISIBLE_P, VISIBLE_Q = (distributions(2, 6, torch.Generator().manual_seed(1))).tolist()
ONE_HOT = torch.eye(3)[[2, 1, 0]].tolist()

CHECKS = {
    "test_process_logits": Check(
        "process_logits", fixed({"cases": [{"logits": LOGITS, "temperature": t, "top_k": k}
                                           for t, k in [(1.0, None), (0.0, None), (2.0, None), (1.0, 2)]]}),
        judge_tensors("process_logits", "logits", "temperature", "top_k"), "process_logits on the visible cases"),
    "test_process_logits_hidden": Check(
        "process_logits", process_cases, judge_tensors("process_logits", "logits", "temperature", "top_k"),
        "process_logits on random (3, 7) logits at five temperature / top-k settings"),
    "test_residual": Check(
        "residual", fixed({"cases": [{"p": [0.5, 0.3, 0.2], "q": [0.2, 0.3, 0.5]},
                                     {"p": [0.5, 0.3, 0.2], "q": [0.5, 0.3, 0.2]}]}),
        judge_tensors("residual", "p", "q"), "residual on the visible cases"),
    "test_residual_hidden": Check(
        "residual", residual_cases, judge_tensors("residual", "p", "q"),
        "residual of random distributions over 9 tokens, and residual(p, p)"),
    "test_accepted_count": Check(
        "accepted_count", fixed({"cases": [
            {"tokens": [0, 1], "p": [[0.9, 0.1], [0.5, 0.5]], "q": [[0.9, 0.1], [0.5, 0.5]], "u": [0.99, 0.99]},
            {"tokens": [0, 0], "p": [[0.2, 0.8], [0.9, 0.1]], "q": [[0.8, 0.2], [0.1, 0.9]], "u": [0.5, 0.5]},
            {"tokens": [1, 1], "p": [[0.2, 0.8], [0.9, 0.1]], "q": [[0.8, 0.2], [0.1, 0.9]], "u": [0.9, 0.5]}]}),
        judge_counts, "accepted_count on the visible cases"),
    "test_accepted_count_hidden": Check(
        "accepted_count", count_cases, judge_counts,
        "accepted_count on hand-made and random drafts (ratio p/q, first rejection)"),
    "test_verify": Check(
        "verify", fixed({"cases": [
            {"tokens": [1], "p": [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], "q": [[0.5, 0.5, 0.0]], "seed": 0},
            {"tokens": [0], "p": [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], "q": [[1.0, 0.0, 0.0]], "seed": 0},
            {"tokens": [2, 1], "p": ONE_HOT, "q": ONE_HOT[:2], "seed": 0}]}),
        judge_verify_visible, "verify on the visible cases"),
    "test_verify_bonus_hidden": Check("verify_repeated", bonus_cases, judge_bonus,
                                      "verify when every drafted token is accepted (k = 1 to 4): the bonus token "
                                      "is sampled from the last row of p"),
    "test_verify_rejection_hidden": Check(
        "verify_rejection", rejection_inputs, judge_rejection,
        "verify after a rejection, and the distribution of the first emitted token"),
    "test_histogram": Check(
        "first_token_histogram", fixed({"cases": [{"p": VISIBLE_P, "q": VISIBLE_Q, "n": 3000, "seed": 0}]}),
        judge_histogram_visible, "first_token_histogram on the visible case (3000 draws approach p, and follow "
                                 "verify when verify is broken)"),
    "test_histogram_hidden": Check("first_token_histogram", histogram_cases, judge_histogram,
                                   "first_token_histogram converges to p (4000 draws, random p and q), and "
                                   "follows verify when verify is broken"),
    "test_verify_block": Check(
        "verify_block", fixed({"cases": [
            {"tokens": [0, 1], "p": [[0.2, 0.8], [0.6, 0.4], [1.0, 0.0]], "q": [[0.4, 0.6], [0.8, 0.2]], "seed": s}
            for s in range(3)] + [{"tokens": [2, 1], "p": ONE_HOT, "q": ONE_HOT[:2], "seed": 0}]}),
        judge_block, "verify_block on the visible cases"),
    "test_verify_block_hidden": Check("verify_block", block_cases, judge_block,
                                      "verify_block on random drafts (k = 1 to 4) and on drafts whose later token "
                                      "repays an early one"),
    "test_verify_block_lossless_hidden": Check("verify_block_lossless", block_lossless_inputs, judge_block_lossless,
                                               "verify_block over 4000 two-token drafts: lossless (chi-square) and "
                                               "keeping what block verification keeps"),
}
