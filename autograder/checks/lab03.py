"""Checks of lab 3 (draft trees): every ancestor in the mask (not only the parent), depth positions (not the
node index), the walk that follows the matching child, the bonus after the deepest accepted node, Medusa trees
that read each depth's own head, the 4D float mask with the committed context visible, one real forward of a
seeded Llama over a tree that matches sequential decoding node by node, and the lossless multi-candidate
rejection under sampling (siblings renormalised, residual updated, correction and bonus tokens from the right
rows), proven statistically. Hidden cases are random trees, models and distributions drawn for every run.
The sampling cases carry no expected path or token (the reference computes their one possible outcome here),
and the histogram is also run with verify_tree_sampling broken: it must follow the broken rule, so a histogram
sampled from p without the verification fails."""

from __future__ import annotations

import torch

from autograder.checks._common import (
    Check,
    Fail,
    as_int,
    as_ints,
    as_tensor,
    chi_square_pvalue,
    decode,
    distributions,
    fixed,
    histogram,
    histogram_run,
    require,
    require_follows_broken_rule,
    serve_case_models,
    show,
)

P_VALUE = 1e-6  # an honest solution fails a statistical check with this probability (per test)

#        root
#      /   |   \
#     0    1    2
#    / \        |
#   3   4       5
#   |   |
#   6   7
PARENTS = [-1, -1, -1, 0, 0, 2, 3, 4]
EXAMPLE_PARENTS = [-1, -1, 0, 0, 1, 2]  # the notebook's example tree
CONTEXT = [3, 14, 15, 9, 2, 6]  # the notebook's committed context
VOCAB = 32
# Both children of the root (tokens 0 and 1) are always rejected, and the correction token is always 3 when
# q is renormalised and p updated after each rejection (see the notebook's worked example).
SURE_P, SURE_Q = [0.0, 0.0, 0.85, 0.15], [0.5, 0.1, 0.4, 0.0]


def random_parents(n: int, generator: torch.Generator) -> list[int]:
    """A random tree of `n` nodes, parents before children (-1: a child of the root)."""
    return [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)]


def ancestors_or_self(parents: list[int], i: int) -> set[int]:
    seen = set()
    while i != -1:
        seen.add(i)
        i = parents[i]
    return seen


def root_path(parents: list[int], i: int) -> list[int]:
    """The nodes from the root's child down to node i (empty for the root, i = -1)."""
    return sorted(ancestors_or_self(parents, i))


def judge_mask(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        parents = case["parents"]
        n = len(parents)
        mask = as_tensor(answer, (n, n))
        require(mask.dtype == torch.bool, f"tree_attention_mask({parents}) should be a bool tensor, got "
                                          f"{show(mask)}")
        for i in range(n):
            expected, got = ancestors_or_self(parents, i), {j for j in range(n) if bool(mask[i, j])}
            require(got == expected, f"tree_attention_mask({parents}): node {i} should see exactly the nodes "
                                     f"{sorted(expected)}, it sees {sorted(got)}")


def mask_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"parents": PARENTS}] + [{"parents": random_parents(n, generator)} for n in (6, 9, 12)]}


def judge_positions(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["tree_position_ids"](case["parents"], case["start"]).tolist()
        got = as_ints(answer)
        require(got == expected, f"tree_position_ids({case['parents']}, start={case['start']}): expected "
                                 f"{expected}, got {got}")


def position_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"parents": PARENTS, "start": 7}] + [
        {"parents": random_parents(n, generator), "start": int(torch.randint(0, 50, (1,), generator=generator))}
        for n in (7, 11)]}


def judge_walk(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected_path, expected_bonus = ref["verify_tree"](case["tokens"], case["parents"], case["predictions"],
                                                           case["root_prediction"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"verify_tree should return (path, token), got {show(got)}")
        path, token = as_ints(got[0]), as_int(got[1])
        require(path == expected_path, f"verify_tree(tokens={case['tokens']}, parents={case['parents']}, "
                                       f"predictions={case['predictions']}, root_prediction="
                                       f"{case['root_prediction']}): expected the path {expected_path}, got {path}")
        require(token == expected_bonus, f"verify_tree(tokens={case['tokens']}, parents={case['parents']}, "
                                         f"predictions={case['predictions']}, root_prediction="
                                         f"{case['root_prediction']}): after the path {path} the next token is "
                                         f"{expected_bonus}, got {token}")


def walk_cases(generator: torch.Generator, ref: dict, bonus: bool) -> dict:
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]
    if bonus:
        cases = [{"tokens": tokens, "parents": PARENTS, "predictions": [13, 0, 15, 16, 0, 42, 33, 0],
                  "root_prediction": 12}]
    else:  # the target wants 10, then 14 (the SECOND child of node 0), then 17; and a root nothing matches
        cases = [{"tokens": tokens, "parents": PARENTS, "predictions": [14, 0, 0, 0, 17, 0, 0, 21],
                  "root_prediction": r} for r in (10, 99)]
    for n in (9, 14):
        parents = random_parents(n, generator)
        node_tokens = (torch.randperm(50, generator=generator)[:n] + 100).tolist()
        predictions = torch.randint(100, 150, (n,), generator=generator).tolist()
        leaf = int(torch.randint(0, n, (1,), generator=generator))
        path = root_path(parents, leaf)
        for parent, child in zip(path, path[1:], strict=False):
            predictions[parent] = node_tokens[child]  # the target agrees along a random root-to-leaf path
        cases.append({"tokens": node_tokens, "parents": parents, "predictions": predictions,
                      "root_prediction": node_tokens[path[0]]})
    return {"cases": cases}


VISIBLE_WALK = [{"tokens": [10, 11, 12, 13, 14, 15], "parents": EXAMPLE_PARENTS, "predictions": [13, 0, 0, 42, 0, 0],
                 "root_prediction": r} for r in (10, 99)]


def judge_medusa(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        choices = [tuple(c) for c in case["choices"]]
        expected = ref["medusa_tree"](case["head_top"], choices)
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"medusa_tree should return (tokens, parents), got "
                                                         f"{show(got)}")
        tokens, parents = as_ints(got[0]), as_ints(got[1])
        require(tokens == expected[0], f"medusa_tree(head_top={case['head_top']}, choices={case['choices']}): "
                                       f"expected the tokens {expected[0]}, got {tokens}")
        require(parents == expected[1], f"medusa_tree(head_top={case['head_top']}, choices={case['choices']}): "
                                        f"expected the parents {expected[1]}, got {parents}")


def medusa_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"head_top": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
              "choices": [[0], [1], [2], [0, 0], [0, 2], [1, 1], [0, 2, 1]]}]
    head_top = torch.randperm(40, generator=generator)[:12].reshape(3, 4).tolist()
    choices = [[0], [1], [3], [0, 1], [0, 3], [1, 0], [0, 1, 2], [0, 3, 0]]
    cases.append({"head_top": head_top, "choices": choices})
    return {"cases": cases}


# --- the 4D mask and one real forward ---------------------------------------------------------------------


def judge_mask4d(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        parents, past, dtype = case["parents"], case["past"], case["dtype"]
        n = len(parents)
        label = f"tree_mask_4d({parents}, past={past}, dtype=torch.{dtype})"
        got = decode(answer)
        require(isinstance(answer, dict) and answer.get("dtype") == f"torch.{dtype}"
                and isinstance(got, torch.Tensor) and tuple(got.shape) == (1, 1, n, past + n),
                f"{label}: expected a torch.{dtype} tensor of shape {(1, 1, n, past + n)}, got "
                f"{answer.get('dtype') if isinstance(answer, dict) else type(got).__name__} of shape "
                f"{tuple(got.shape) if isinstance(got, torch.Tensor) else '?'}")
        low = torch.finfo(getattr(torch, dtype)).min
        for i in range(n):
            visible = set(range(past)) | {past + j for j in ancestors_or_self(parents, i)}
            expected = [0.0 if j in visible else low for j in range(past + n)]
            row = got[0, 0, i].tolist()
            require(row == expected, f"{label}: row {i} should be 0 at the context and at the nodes "
                                     f"{sorted(ancestors_or_self(parents, i))} and {low:.4g} elsewhere: expected "
                                     f"{show(expected)}, got {show(row)}")


def mask4d_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"parents": PARENTS, "past": 3, "dtype": "float32"}]
    for n, dtype in ((5, "float16"), (9, "float64"), (7, "float32")):
        past = int(torch.randint(0, 6, (1,), generator=generator))
        cases.append({"parents": random_parents(n, generator), "past": past, "dtype": dtype})
    return {"cases": cases}


def judge_tree_logits(inputs: dict, answers: list, ref: dict, served: bool = True) -> None:
    """Every row equals sequential decoding's logits on the same model; on a served model (hidden weights,
    forwards counted here), the prefill and ONE forward over the whole tree."""
    for index, (case, answer) in enumerate(zip(inputs["cases"], answers, strict=True)):
        parents, tokens, context = case["parents"], case["tokens"], case["context"]
        n = len(parents)
        label = f"tree_logits with context {context}, tokens {tokens}, parents {parents}"
        got = as_tensor(answer["logits"], (n + 1, VOCAB))
        require(bool(torch.isfinite(got).all()), f"{label}: the logits hold NaN or infinite entries")
        model = ref["tiny_llama"](model_seed(inputs, index))
        for i in range(-1, n):
            path = [tokens[j] for j in root_path(parents, i)]
            expected = ref["next_token_logits"](model, context + path)
            gap = float((got[i + 1] - expected).abs().max())
            require(gap < 1e-4, f"{label}: row {i + 1} ({'the root' if i < 0 else f'node {i}'}, path {path}) "
                                f"should equal sequential decoding's logits {show(expected[:3])}..., got "
                                f"{show(got[i + 1][:3])}... (largest gap {gap:.2g})")
        if served:
            forwards = inputs["measured"]["forwards"][f"case{index}"]
            widest = max((f["tokens"] for f in forwards), default=0)
            require(len(forwards) <= 2 and widest >= n,
                    f"{label}: the model ran {len(forwards)} times, on {[f['tokens'] for f in forwards]} tokens; "
                    "one prefill and ONE forward over the whole tree is the point of a tree")


def model_seed(inputs: dict, index: int) -> int:
    """The seed of case `index`'s model: public for the visible case, secret (served) for the hidden ones."""
    return inputs["secret"]["seeds"][index] if "secret" in inputs else inputs["cases"][index]["seed"]


def tree_logits_cases(generator: torch.Generator, ref: dict) -> dict:
    cases, seeds = [], []
    for parents in (PARENTS, random_parents(10, generator)):
        context = torch.randint(0, VOCAB, (int(torch.randint(3, 12, (1,), generator=generator)),),
                                generator=generator).tolist()
        seeds.append(int(torch.randint(1, 10_000, (1,), generator=generator)))
        cases.append({"context": context, "tokens": torch.randint(0, VOCAB, (len(parents),), generator=generator)
                      .tolist(), "parents": parents})
    return {"cases": cases, "secret": {"seeds": seeds}}


# --- lossless tree verification under sampling -----------------------------------------------------------


def sampling_result(answer) -> tuple[list[int], int]:
    got = decode(answer)
    if not (isinstance(got, list | tuple) and len(got) == 2):
        raise Fail(f"verify_tree_sampling should return (path, token), got {show(got)}")
    return as_ints(got[0]), as_int(got[1])


def judge_sampling_cases(inputs: dict, answers: list, ref: dict) -> None:
    """The fixed cases have one possible outcome each (the target is sure, or rejects every child): the
    reference computes it here with the case's seed, so the inputs carry no expected path or token."""
    for case, answer in zip(inputs["cases"], answers, strict=True):
        path, token = sampling_result(answer)
        expected_path, expected_token = ref["verify_tree_sampling"](
            list(case["tokens"]), list(case["parents"]), torch.tensor(case["p"]), torch.tensor(case["q"]),
            torch.Generator().manual_seed(case["seed"]))
        expected = (list(expected_path), int(expected_token))
        require((path, token) == expected, f"verify_tree_sampling(tokens={case['tokens']}, parents="
                                           f"{case['parents']}, seed {case['seed']}): {why(case, expected)}: "
                                           f"expected ({expected[0]}, {expected[1]}), got ({path}, {token})")


def why(case: dict, expected: tuple[list[int], int]) -> str:
    """What makes the outcome of a fixed sampling case certain, for the failure message."""
    path, token = expected
    node = path[-1] if path else -1
    if node not in case["parents"]:  # the walk ended at a leaf: every step was certain, then the bonus token
        return (f"the target is sure of the path {path} (any sibling before a right child has p = 0 there), then "
                f"of the bonus token {token}")
    below = f"below the sure child {case['tokens'][path[-1]]}, " if path else ""
    slot = path[-1] + 1 if path else 0
    return (f"{below}p = {show(case['p'][slot])}, q = {show(case['q'][slot])}: both children rejected, and the "
            f"residual leaves only the correction token {token}")


def visible_sampling_cases() -> list[dict]:
    chain = {"tokens": [2, 1], "parents": [-1, 0], "p": [[0.0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]],
             "q": [[0.25] * 4] * 3, "seed": 0}
    rejected = [{"tokens": [0, 1], "parents": [-1, -1], "p": [SURE_P] * 3, "q": [SURE_Q] * 3, "seed": seed}
                for seed in range(20)]
    return [chain] + rejected


def judge_visible_sampling(inputs: dict, answers: list, ref: dict) -> None:
    judge_sampling_cases(inputs, answers, ref)


def worked_rejection_cases(generator: torch.Generator, vocab: int, below_a_sure_child: bool) -> list[dict]:
    """The notebook's worked rejection on relabelled tokens, at the root or below a child the target is sure
    of: both children rejected, and the correction token is always the same."""
    cases = []
    for _ in range(2):
        perm = torch.randperm(vocab, generator=generator).tolist()  # token t of the worked case becomes perm[t]
        p, q = [0.0] * vocab, [0.0] * vocab
        for t in range(4):
            p[perm[t]], q[perm[t]] = SURE_P[t], SURE_Q[t]
        uniform = [1.0 / vocab] * vocab
        if below_a_sure_child:  # node 0 (token perm[4]) is surely accepted; its children are perm[0] and perm[1]
            sure = [1.0 if t == perm[4] else 0.0 for t in range(vocab)]
            tree = {"tokens": [perm[4], perm[0], perm[1]], "parents": [-1, 0, 0], "p": [sure, p, uniform, uniform],
                    "q": [uniform, q, uniform, uniform]}
        else:
            tree = {"tokens": [perm[0], perm[1]], "parents": [-1, -1], "p": [p] * 3, "q": [q] * 3}
        seeds = torch.randint(0, 2**31, (10,), generator=generator).tolist()
        cases += [tree | {"seed": s} for s in seeds]
    return cases


def sure_chain_case(k: int, generator: torch.Generator, vocab: int) -> dict:
    """A chain of k right children, each behind a wrong sibling (p = 0 there: always rejected), with one-hot
    target distributions: the path and the bonus token are certain."""
    chain = torch.randperm(vocab, generator=generator)[: k + 1].tolist()
    tokens = [t for d in range(k) for t in ((chain[d] + 1) % vocab, chain[d])]  # node 2d wrong, 2d + 1 right
    parents = [2 * d - 1 for d in range(k) for _ in range(2)]
    p_rows = torch.full((2 * k + 1, vocab), 1.0 / vocab)
    p_rows[0] = torch.nn.functional.one_hot(torch.tensor(chain[0]), vocab).float()
    for d in range(k):
        p_rows[2 * d + 2] = torch.nn.functional.one_hot(torch.tensor(chain[d + 1]), vocab).float()
    return {"tokens": tokens, "parents": parents, "p": p_rows.tolist(),
            "q": torch.full((2 * k + 1, vocab), 1.0 / vocab).tolist(),
            "seed": int(torch.randint(0, 2**31, (1,), generator=generator))}


def sampled_run(widths: list[int], p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator) -> dict:
    return {"widths": widths, "p": p.tolist(), "q": q.tolist(), "n": n,
            "seed": int(torch.randint(0, 2**31, (1,), generator=generator))}


def sampling_inputs(generator: torch.Generator, ref: dict, depth: bool) -> dict:
    vocab = 6
    sure_p, sure_q = torch.tensor(SURE_P + [0.0, 0.0]), torch.tensor(SURE_Q + [0.0, 0.0])
    if depth:  # two levels: the tokens after an accepted child must follow the child's p
        p, q = distributions(3, vocab, generator, sharpness=1.5), distributions(2, vocab, generator, sharpness=1.5)
        cases = worked_rejection_cases(generator, vocab, below_a_sure_child=True) + [
            sure_chain_case(2, generator, vocab)]
        runs = [sampled_run([2, 2], p, q, 800, generator),
                sampled_run([2, 2], torch.stack([p[0], sure_p, p[2]]), torch.stack([q[0], sure_q]), 800, generator)]
        return {"cases": cases, "runs": runs}
    p, q = distributions(2, vocab, generator, sharpness=1.5)
    cases = worked_rejection_cases(generator, vocab, below_a_sure_child=False) + [
        sure_chain_case(k, generator, vocab) for k in (1, 3)]
    runs = [sampled_run([3], torch.stack([p, p]), q[None], 1000, generator),
            sampled_run([2], torch.stack([sure_p, sure_p]), sure_q[None], 1000, generator)]
    return {"cases": cases, "runs": runs}


def judge_runs(inputs: dict, answer: dict, ref: dict) -> None:
    judge_sampling_cases(inputs, answer["cases"], ref)
    for run, emitted in zip(inputs["runs"], answer["runs"], strict=True):
        emitted = [as_ints(tokens) for tokens in decode(emitted)]
        p, widths, n = torch.tensor(run["p"]), run["widths"], run["n"]
        require(all(1 <= len(tokens) <= len(widths) + 1 for tokens in emitted),
                f"every verification emits the accepted tokens plus exactly one: got {len(emitted[0])} tokens "
                f"from a tree of depth {len(widths)}")
        for level in range(len(widths) + 1):
            reached = [tokens[level] for tokens in emitted if len(tokens) > level]
            if len(reached) < 50:
                continue
            counts = histogram(reached, p.shape[-1])
            pvalue = chi_square_pvalue(counts, p[level])
            what = "first emitted token" if level == 0 else f"emitted token {level + 1} (after {level} accepted)"
            require(pvalue > P_VALUE, f"{n} trees with {widths} children per level drawn from q = "
                                      f"{show(torch.tensor(run['q']))}: the {what} is not distributed as the "
                                      f"target's p = {show(p[level])} (chi-square p-value {pvalue:.1e}); observed "
                                      f"{show(counts / counts.sum())}")


def histogram_cases(generator: torch.Generator, ref: dict) -> dict:
    """Random p and q far apart (so that counts that follow q are never mistaken for p), and the worked case."""
    while True:
        p, q = distributions(2, 6, generator, sharpness=1.5)
        if float((p - q).abs().sum() / 2) >= 0.25:
            break
    seeds = torch.randint(0, 2**31, (2,), generator=generator).tolist()
    return {"cases": [{"p": p.tolist(), "q": q.tolist(), "width": 3, "n": 1000, "seed": seeds[0]},
                      {"p": SURE_P + [0.0, 0.0], "q": SURE_Q + [0.0, 0.0], "width": 2, "n": 1000, "seed": seeds[1]}]}


# How the messages name the broken verification the histogram probe also runs.
BROKEN_RULE = "verify_tree_sampling replaced by one that accepts the first child"


def histogram_counts(case: dict, answer, broken: bool) -> torch.Tensor:
    """The counts of the real run, or (`broken`) of the run with the broken rule."""
    return histogram_run(case, answer, broken, BROKEN_RULE)


def require_follows_verify(case: dict, answer) -> None:
    """The run with the broken rule follows q (a histogram counts what `verify_tree_sampling` emits)."""
    require_follows_broken_rule(case, answer, BROKEN_RULE, "verify_tree_sampling", P_VALUE)


def judge_histogram_known(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        counts = histogram_counts(case, answer, broken=False)
        expected = [float(case["n"]) if x == 1 else 0.0 for x in case["p"]]
        require(counts.tolist() == expected, f"p is one-hot on token {case['p'].index(1.0)}: expected {expected}, "
                                             f"got {show(counts)}")
        require_follows_verify(case, answer)


def judge_histogram(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        counts, p = histogram_counts(case, answer, broken=False), torch.tensor(case["p"])
        pvalue = chi_square_pvalue(counts, p)
        require(pvalue > P_VALUE, f"first_token_histogram(p={show(p)}, q={show(case['q'])}, width={case['width']}, "
                                  f"n={case['n']}) does not match p (chi-square p-value {pvalue:.1e}): observed "
                                  f"{show(counts / case['n'])}")
        require_follows_verify(case, answer)


CHECKS = {
    "test_mask": Check("tree_attention_mask", fixed({"cases": [{"parents": EXAMPLE_PARENTS}]}), judge_mask,
                       "tree_attention_mask on the example tree"),
    "test_mask_hidden": Check("tree_attention_mask", mask_cases, judge_mask,
                              "tree_attention_mask on an 8-node tree and random trees"),
    "test_positions": Check("tree_position_ids", fixed({"cases": [{"parents": EXAMPLE_PARENTS, "start": 100}]}),
                            judge_positions, "tree_position_ids on the example tree"),
    "test_positions_hidden": Check("tree_position_ids", position_cases, judge_positions,
                                   "tree_position_ids on an 8-node tree and random trees"),
    "test_verify_tree": Check("verify_tree", fixed({"cases": VISIBLE_WALK}), judge_walk,
                              "verify_tree on the example tree"),
    "test_verify_tree_hidden": Check("verify_tree", lambda g, ref: walk_cases(g, ref, bonus=False), judge_walk,
                                     "verify_tree's walk on an 8-node tree and random trees"),
    "test_verify_tree_bonus_hidden": Check("verify_tree", lambda g, ref: walk_cases(g, ref, bonus=True), judge_walk,
                                           "the token after the deepest accepted node"),
    "test_medusa": Check("medusa_tree", fixed({"cases": [{"head_top": [[4, 5], [6, 7], [8, 9]],
                                                          "choices": [[0], [1], [0, 1], [0, 1, 0]]}]}),
                         judge_medusa, "medusa_tree on the visible case"),
    "test_medusa_hidden": Check("medusa_tree", medusa_cases, judge_medusa,
                                "medusa_tree with three heads and a random four-guess tree"),
    "test_mask4d": Check("tree_mask_4d", fixed({"cases": [{"parents": [-1, -1, 0], "past": 2, "dtype": "float32"}]}),
                         judge_mask4d, "tree_mask_4d on the worked example"),
    "test_mask4d_hidden": Check("tree_mask_4d", mask4d_cases, judge_mask4d,
                                "tree_mask_4d on an 8-node tree and random trees, contexts and dtypes"),
    "test_tree_logits": Check(
        "tree_logits", fixed({"cases": [{"seed": 0, "context": CONTEXT, "tokens": [20, 21, 22, 23, 24, 25],
                                         "parents": EXAMPLE_PARENTS}]}),
        lambda inputs, answers, ref: judge_tree_logits(inputs, answers, ref, served=False),
        "tree_logits on the example tree against sequential decoding"),
    "test_tree_logits_hidden": Check("tree_logits_served", tree_logits_cases, judge_tree_logits,
                                     "tree_logits of new models on random trees against sequential decoding, "
                                     "in one forward after the prefill", serve=serve_case_models),
    "test_verify_sampling": Check("verify_tree_sampling", fixed({"cases": visible_sampling_cases()}),
                                  judge_visible_sampling, "verify_tree_sampling on the worked examples"),
    "test_verify_sampling_hidden": Check(
        "verify_tree_sampling_runs", lambda g, ref: sampling_inputs(g, ref, depth=False), judge_runs,
        "verify_tree_sampling on relabelled worked cases, sure chains, and the first token of sampled trees"),
    "test_verify_sampling_depth_hidden": Check(
        "verify_tree_sampling_runs", lambda g, ref: sampling_inputs(g, ref, depth=True), judge_runs,
        "verify_tree_sampling below an accepted child, and on two-level sampled trees (every emitted token "
        "follows the target's p)"),
    "test_histogram": Check("first_token_histogram", fixed({"cases": [{
        "p": [0.0, 0, 1, 0, 0], "q": [0.3, 0.3, 0.1, 0.2, 0.1], "width": 3, "n": 200, "seed": 0}]}),
        judge_histogram_known, "first_token_histogram on the one-hot case, and with verify_tree_sampling broken"),
    "test_histogram_hidden": Check("first_token_histogram", histogram_cases, judge_histogram,
                                   "first_token_histogram converges to p (1000 trees each, random and worked p and q), "
                                   "and follows verify_tree_sampling when it is broken"),
}
