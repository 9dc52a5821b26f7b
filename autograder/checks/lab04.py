"""Checks of lab 4 (EAGLE drafting with a real head): the feature/token shift, the head's forward pass (fc over
[feature ; embedding], one Llama decoder layer with its KV cache, the closing norm), rolling the head on its own
features with one cache, ranking by cumulative score with renumbered parents, the EAGLE-2 dynamic tree, and
both drafters plugged into greedy speculative decoding (tau). The lab's `head` is trained in its setup cell
(`train_head`, seeded, one thread), and the reference namespace here runs that setup, so the judges hold the
same trained head as the sandbox. Hidden cases use random prompts and settings drawn for every run, on the
lab's trained head or on untrained heads of random seeds (`EagleHead(seed)`: cheap to build on both sides, and
a method must be right on any head).

Drafts are compared on probabilities, not only on tokens: the probes send every feature the target's output
layer scored during the student's call, and the judges require the reference's distribution at every draft
step (log-probabilities within LOGP_TOL) among them. The hidden heads and prompts are drawn until feeding a
predicted feature one position off, or with the wrong token, changes those distributions by ten times that
tolerance, so a chain fed at the wrong positions fails even where its argmax tokens agree. The loop checks send
no expected value: the probe decodes along the greedy continuation it computes from the lab's setup, and the
judge recomputes that continuation with the reference's target, checks every context the drafter saw against
it, re-verifies every draft and compares every step's probabilities with the reference drafter's."""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._common import Check, Fail, as_ints, as_tensor, decode, fixed, require, require_close, show

D, VOCAB = 32, 64  # the lab's feature size and vocabulary
PROMPT = [5, 17, 42, 8, 23, 61, 3]  # the lab's prompt
# Honest implementations of the head agree to about 1e-6 in log-probability (op order, masks, cache or no
# cache); a predicted feature fed one position off moves them by 3e-3 and more on the lab's trained head, and by
# 2e-2 and more on untrained heads (random prompts); sensitive_case() makes sure of it for every hidden case.
LOGP_TOL = 2e-5
MARGIN = 10 * LOGP_TOL  # how much a position or token error must change a hidden case's distributions
TRIES = 30  # draws of a hidden head and prompt before the most sensitive one is taken
MAX_SCORED = 400  # scored feature rows the probe sends per call (probes/lab04.py), and the most a judge reads


def ref_head(ref: dict, case: dict):
    """The case's head, as the probe takes it: the lab's trained `head` when the case names no seed, else the
    untrained `EagleHead(seed)` of its seed."""
    seed = case.get("head_seed")
    return ref["head"] if seed is None else ref["EagleHead"](seed=seed)


def head_label(case: dict) -> str:
    """How messages name the case's head."""
    seed = case.get("head_seed")
    return "the lab's trained head" if seed is None else f"an untrained head of seed {seed}"


def reference_scored(ref: dict, run: Callable, *args, **kwargs) -> tuple:
    """`run(*args, **kwargs)` (a reference drafter), and every feature row the reference target's output layer
    scored meanwhile (rows, D)."""
    rows: list[torch.Tensor] = []
    handle = ref["target"].lm_head.register_forward_hook(
        lambda module, args, output: rows.append(args[0].detach().reshape(-1, D)))
    try:
        with torch.no_grad():
            result = run(*args, **kwargs)
    finally:
        handle.remove()
    return result, torch.cat(rows) if rows else torch.zeros(0, D)


def log_probs(ref: dict, rows: torch.Tensor) -> torch.Tensor:
    """Token log-probabilities (rows, VOCAB) the target's output layer gives feature rows (rows, D)."""
    with torch.no_grad():
        return torch.log_softmax(ref["logits_of"](rows.float()).double(), dim=-1)


def require_scored(ref: dict, answer, expected: torch.Tensor, label: str, step: str) -> None:
    """Fail unless every reference distribution (the rows `expected` scored) is among the distributions of the
    feature rows the student's drafter scored (`answer`, plain), within LOGP_TOL in log-probability."""
    got = as_tensor(answer)
    require(got.dim() == 2 and got.shape[-1] in (0, D), f"{label}: the scored features should be rows of {D} "
                                                        f"values, got shape {tuple(got.shape)}")
    require(len(got) > 0, f"{label}: the target's output layer never scored a feature during the call (each draft "
                          "step is scored with logits_of)")
    # the probe sends at most 400 rows; more would only make the comparison below costly for the grader
    require(len(got) <= MAX_SCORED, f"{label}: {len(got)} scored features, more than the {MAX_SCORED} the probe sends")
    gaps = (log_probs(ref, got)[:, None, :] - log_probs(ref, expected)[None, :, :]).abs().amax(-1).amin(0)
    gaps = torch.nan_to_num(gaps, nan=float("inf"))
    worst = int(gaps.argmax())
    require(float(gaps[worst]) <= LOGP_TOL,
            f"{label}: the distribution at {step} {worst + 1} of {len(expected)} is not the reference's (the closest "
            f"feature your drafter scored is {float(gaps[worst]):.2g} away in log-probability, tolerance "
            f"{LOGP_TOL:g}): a predicted feature fed at the wrong position, or with the wrong token, changes it "
            "even where the argmax tokens agree")


def chain_log_probs(ref: dict, head, tokens: list[int], k: int, shift: int = 0, wrong_token: bool = False):
    """The chain's k draft distributions (k, VOCAB) after `tokens`, rolled as the lab asks; `shift` moves every
    predicted feature's position, `wrong_token` feeds the context's last token instead of the drafted one (the
    errors a hidden case must be sensitive to)."""
    with torch.no_grad():
        features, n = ref["target_features"](tokens[:-1]), len(tokens) - 1
        cache = head.new_cache()
        feature = ref["head_forward"](head, features, torch.tensor(tokens[1:]), torch.arange(n), cache)[-1]
        steps = []
        for i in range(k):
            steps.append(torch.log_softmax(ref["logits_of"](feature).double(), dim=-1))
            token = tokens[-1] if wrong_token else int(steps[-1].argmax())
            if i + 1 < k:
                feature = ref["head_forward"](head, feature[None], torch.tensor([token]), torch.tensor([n + i + shift]),
                                              cache)[0]
        return torch.stack(steps)


def sensitivity(ref: dict, case: dict, k: int) -> float:
    """How much the smallest of the errors (a position one off either way, the wrong token) changes the chain's
    draft distributions for this case's head and prompt (largest log-probability change)."""
    head, tokens = ref_head(ref, case), list(case["tokens"])
    right = chain_log_probs(ref, head, tokens, k)
    return min(float((chain_log_probs(ref, head, tokens, k, **error) - right).abs().max())
               for error in ({"shift": -1}, {"shift": 1}, {"wrong_token": True}))


def sensitive_case(generator: torch.Generator, ref: dict, steps: int, **settings) -> dict:
    """A random head and prompt (with `settings`) where the errors sensitivity() tries change a chain of `steps`
    draft distributions by MARGIN (or, after TRIES draws, the most sensitive one drawn)."""
    best, best_gap = None, -1.0
    for _ in range(TRIES):
        case = {**random_head(generator), "tokens": random_prompt(generator), **settings}
        gap = sensitivity(ref, case, steps)
        if gap > best_gap:
            best, best_gap = case, gap
        if gap >= MARGIN:
            break
    return best


def random_prompt(generator: torch.Generator, low: int = 4, high: int = 10) -> list[int]:
    n = int(torch.randint(low, high, (1,), generator=generator))
    return torch.randint(0, VOCAB, (n,), generator=generator).tolist()


def random_head(generator: torch.Generator) -> dict:
    """The lab's trained head (one draw in three: "head_seed" None) or an untrained head of a random seed (the
    lab's `EagleHead(seed)`; training one per case would cost seconds on both sides)."""
    if int(torch.randint(0, 3, (1,), generator=generator)) == 0:
        return {"head_seed": None}
    return {"head_seed": int(torch.randint(2, 10_000, (1,), generator=generator))}


# ------------------------------------------------------------------------------------------ 1. training pairs


def judge_pairs(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        features, tokens = torch.tensor(case["features"]), torch.tensor(case["tokens"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 3, "eagle_training_pairs should return three tensors, got "
                                                         f"{show(got)}")
        n = len(tokens)
        require_close(got[0], features[:-1], f"the input features for {n} positions (those of positions 0 .. n - 2)")
        got_tokens = as_tensor(got[1], (n - 1,))
        require(got_tokens.tolist() == tokens[1:].tolist(), f"tokens {tokens.tolist()}: the token paired with the "
                                                            f"feature at position i is the token at i + 1, expected "
                                                            f"{tokens[1:].tolist()}, got {got_tokens.tolist()}")
        require_close(got[2], features[1:], f"the target features for {n} positions (those of positions 1 .. n - 1)")


PAIRS_VISIBLE = {"cases": [{"features": torch.arange(12.0).reshape(6, 2).tolist(), "tokens": [10, 11, 12, 13, 14, 15]}]}


def pairs_cases(generator: torch.Generator, ref: dict) -> dict:
    n = int(torch.randint(5, 9, (1,), generator=generator))
    return {"cases": [{"features": torch.randn(n, D, generator=generator).tolist(),
                       "tokens": torch.randperm(VOCAB, generator=generator)[:n].tolist()}]}


# ------------------------------------------------------------------------------------------ 2. head forward


def chunks_of(features: torch.Tensor, tokens: list[int], start: int, sizes: list[int]) -> list[dict]:
    chunks, at = [], 0
    for size in sizes:
        chunks.append({"features": features[at : at + size].tolist(), "tokens": tokens[at : at + size],
                       "positions": list(range(start + at, start + at + size))})
        at += size
    return chunks


def head_visible(generator: torch.Generator, ref: dict) -> dict:
    features = ref["target_features"](PROMPT)[:6]
    whole = {"chunks": chunks_of(features, PROMPT[1:7], 0, [6])}
    return {"cases": [whole, {"chunks": chunks_of(features, PROMPT[1:7], 0, [2, 4])}]}


def judge_head_visible(inputs: dict, answers: list, ref: dict) -> None:
    outputs = [decode(a) for a in answers]
    require(all(isinstance(o, list) for o in outputs), f"head_forward should return a tensor per call, got "
                                                       f"{show(outputs)}")
    whole = as_tensor(outputs[0][0], (6, D))
    split = torch.cat([as_tensor(outputs[1][0], (2, D)), as_tensor(outputs[1][1], (4, D))])
    require(torch.allclose(whole, split, atol=1e-5), f"6 positions at once vs 2 then 4 with the cache: expected equal "
                                                     f"features, max difference {(whole - split).abs().max():.3g} "
                                                     "(check the mask and position ids)")
    predicted = ref["logits_of"](whole.float()).argmax(-1).tolist()
    require(predicted == [8, 54, 54, 11, 39, 38], f"tokens predicted from the head's features: expected "
                                                  f"[8, 54, 54, 11, 39, 38], got {predicted}")
    expected = torch.tensor([-1.994, -0.51, -1.04, 1.156])
    require(torch.allclose(whole[-1, :4].float(), expected, atol=2e-3),
            f"the last predicted feature starts with {expected.tolist()} (after head.norm), got "
            f"{[round(v, 3) for v in whole[-1, :4].tolist()]}")


def head_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for sizes in ([3, 1, 1], [2, 4], [5]):
        prompt = random_prompt(generator, 7, 9)
        n = sum(sizes)
        features = ref["target_features"](prompt)[:n] if len(cases) != 2 else torch.randn(n, D, generator=generator)
        cases.append({**random_head(generator), "chunks": chunks_of(features, prompt[1 : n + 1], 0, sizes)})
    return {"cases": cases}


def judge_head(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        head = ref_head(ref, case)
        cache = head.new_cache()
        got = decode(answer)
        require(isinstance(got, list) and len(got) == len(case["chunks"]), f"head_forward should return a tensor "
                                                                           f"per call, got {show(got)}")
        for number, (chunk, out) in enumerate(zip(case["chunks"], got, strict=True)):
            with torch.no_grad():
                expected = ref["head_forward"](head, torch.tensor(chunk["features"]), torch.tensor(chunk["tokens"]),
                                               torch.tensor(chunk["positions"]), cache)
            require_close(out, expected, f"call {number + 1} of {len(got)} into one cache (positions "
                                         f"{chunk['positions']}, {head_label(case)})", atol=1e-4)


# ------------------------------------------------------------------------------------------ 3. chain


CHAIN_VISIBLE = {"cases": [{"tokens": PROMPT, "k": 5}, {"tokens": PROMPT[:4], "k": 6}]}


def draft_of(answer) -> tuple:
    """(draft, scored) from a drafting probe's answer {"draft", "scored"}, or Fail."""
    got = answer if isinstance(answer, dict) else None
    if got is None or "draft" not in got or "scored" not in got:
        raise Fail(f"expected the draft and the features it scored, got {show(decode(answer))}")
    if isinstance(got["draft"], dict) and "error" in got["draft"]:
        decode(got["draft"])  # the student's function raised: say so
    return got["draft"], got["scored"]


def judge_chain_visible(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer, expected in zip(inputs["cases"], answers, ([38, 18, 8, 61, 39], [54, 54, 54, 54, 54, 39]),
                                      strict=True):
        got = as_ints(draft_of(answer)[0])
        label = "PROMPT" if case["tokens"] == PROMPT else "PROMPT[:4]"
        require(got == expected, f"eagle_chain after {label}, k={case['k']}: expected {expected}, got {got}")


def chain_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [sensitive_case(generator, ref, 5, k=5) for _ in range(3)]}


def reference_chain(ref: dict, case: dict, tokens: list[int]) -> tuple:
    """The reference chain after `tokens` with the case's head and k, and the features it scored (the context's
    features are computed before, as the probe does: the target's own forward scores every position)."""
    head, features = ref_head(ref, case), ref["target_features"](tokens[:-1])
    return reference_scored(ref, ref["eagle_chain"], head, features, list(tokens), case["k"])


def judge_chain(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected, rows = reference_chain(ref, case, case["tokens"])
        draft, scored = draft_of(answer)
        got = as_ints(draft)
        label = f"eagle_chain after {case['tokens']} (k={case['k']}, {head_label(case)})"
        require(got == expected, f"{label}: expected {expected}, got {got}")
        require_scored(ref, scored, rows, label, "draft step")


# ------------------------------------------------------------------------------------------ loops


def loop_inputs(**settings) -> Callable[[torch.Generator, dict], dict]:
    """The loop's settings only: the probe computes the greedy continuation itself, the judge recomputes it."""
    return fixed({"prompt": PROMPT, "new_tokens": 32, **settings})


def replay(inputs: dict, answer, wanted: list[int]) -> list[dict]:
    """Check the student's recorded steps against the reference greedy continuation `wanted`: every context the
    drafter saw is the prompt plus the tokens emitted so far, every draft is well formed and verified here (greedy
    rules), and the steps end when the continuation is complete. Returns the decoded steps."""
    got = decode(answer)
    require(isinstance(got, dict) and isinstance(got.get("steps"), list), f"expected the drafts of every step, got "
                                                                          f"{show(got)}")
    prompt, emitted, steps = list(inputs["prompt"]), 0, got["steps"]
    for number, step in enumerate(steps):
        require(isinstance(step, dict), f"step {number + 1}: expected a recorded step, got {show(step)}")
        require(emitted < len(wanted), f"step {number + 1}: a step after all {len(wanted)} tokens were emitted")
        context = as_ints(step.get("context"))
        require(context == prompt + wanted[:emitted],
                f"step {number + 1}: the drafter saw the context {show(context[len(prompt):])} after the prompt, "
                f"expected the first {emitted} tokens of greedy decoding {show(wanted[:emitted])}")
        tokens, parents = as_ints(step.get("tokens")), as_ints(step.get("parents"))
        require(len(parents) == len(tokens) and all(-1 <= p < i for i, p in enumerate(parents))
                and all(0 <= t < VOCAB for t in tokens),
                f"step {number + 1}: the draft {tokens} with parents {parents} is not a well-formed draft")
        node, count = -1, 0
        while emitted + count < len(wanted):
            node = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == wanted[emitted + count]),
                        None)
            if node is None:
                break
            count += 1
        emitted += count + 1
    require(emitted >= len(wanted), f"the drafts stopped after {emitted} of {len(wanted)} tokens")
    return steps


def chain_drafter(ref: dict, inputs: dict, features: torch.Tensor, context: list[int]):
    return ref["eagle_chain"](ref_head(ref, inputs), features, context, inputs["k"])


def tree_drafter(ref: dict, inputs: dict, features: torch.Tensor, context: list[int]):
    return ref["dynamic_tree"](ref_head(ref, inputs), features, context, inputs["depth"], inputs["top_k"],
                               inputs["budget"])


def judge_loop(threshold: float, reference: float, label: str, drafter: Callable, step: str):
    """A loop judge: the replayed drafts reach tau >= `threshold`, and every step's draft distributions are the
    reference `drafter`'s on that step's context (`step` names the unit compared, for messages)."""
    def judge(inputs: dict, answer, ref: dict) -> None:
        with torch.no_grad():
            wanted = ref["greedy"](list(inputs["prompt"]), inputs["new_tokens"])
        steps = replay(inputs, answer, wanted)
        for number, recorded in enumerate(steps):
            context = as_ints(recorded["context"])
            with torch.no_grad():
                features = ref["target_features"](context[:-1])
            _, rows = reference_scored(ref, drafter, ref, inputs, features, context)
            require_scored(ref, recorded.get("scored"), rows, f"{label}, step {number + 1} of the loop", step)
        tau = len(wanted) / len(steps)
        require(tau >= threshold, f"{label}: expected tau >= {threshold} with the lab's trained head (the reference "
                                  f"reaches {reference}), got {tau:.2f}: the drafts are rarely accepted")

    return judge


# ------------------------------------------------------------------------------------------ 4. select


def judge_select(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["select_nodes"](case["parents"], case["scores"], case["budget"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"select_nodes should return (kept, parents), got "
                                                         f"{show(got)}")
        kept, parents = as_ints(got[0]), as_ints(got[1])
        label = f"select_nodes(parents={case['parents']}, scores={show(case['scores'])}, budget={case['budget']})"
        require(kept == expected[0], f"{label}: expected the nodes {expected[0]}, got {kept}")
        require(parents == expected[1], f"{label}: expected the renumbered parents {expected[1]}, got {parents}")


SELECT_VISIBLE = {"cases": [{"parents": [-1, -1, 1, 0], "scores": [-2.0, -0.1, -0.4, -3.0], "budget": 2}]}


def select_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"parents": [-1, -1, 0, 0, 1, 2, 3], "scores": [-0.2, -1.0, -0.5, -0.9, -1.5, -0.7, -2.0],
              "budget": 4}]
    for n in (8, 12):
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)]
        scores: list[float] = []
        for parent in parents:  # cumulative: a child never beats its parent
            step = -float(torch.rand(1, generator=generator)) * 2
            scores.append(round(step + (scores[parent] if parent != -1 else 0.0), 4))
        cases.append({"parents": parents, "scores": scores, "budget": n // 2})
    return {"cases": cases}


# ------------------------------------------------------------------------------------------ 5. dynamic tree


TREE_VISIBLE = {"cases": [{"tokens": PROMPT[:4], "depth": 4, "top_k": 2, "budget": 12}]}


def judge_tree_visible(inputs: dict, answers: list, ref: dict) -> None:
    got = decode(draft_of(answers[0])[0])
    require(isinstance(got, list) and len(got) == 2, f"dynamic_tree should return (tokens, parents), got {show(got)}")
    tokens, parents = as_ints(got[0]), as_ints(got[1])
    expected = ([54, 38, 54, 39, 18, 31, 54, 58, 8, 56, 61, 54],
                [-1, -1, 0, 0, 1, 1, 2, 2, 4, 4, 8, 6])
    require((tokens, parents) == expected, f"dynamic_tree after PROMPT[:4] (depth 4, top_k 2, budget 12): expected "
                                           f"tokens {expected[0]} with parents {expected[1]}, got tokens {tokens} "
                                           f"with parents {parents}")


def tree_cases(generator: torch.Generator, ref: dict) -> dict:
    # The lab's trained head after PROMPT[:3] and PROMPT[:6]: deep trees whose budget exceeds top_k, where an
    # unpruned frontier, a frontier in index order, local ranking or a node fed without its ancestors each change
    # the tree (both cases, on that head); then random cases.
    cases = [{"tokens": PROMPT[:3], "depth": 5, "top_k": 2, "budget": 14},
             {"tokens": PROMPT[:6], "depth": 5, "top_k": 2, "budget": 16}]
    for depth, top_k, budget in ((4, 3, 10), (5, 2, 9), (4, 3, 12)):
        # a head and prompt where a node fed one position off, or with the wrong token, changes the drafts
        cases.append(sensitive_case(generator, ref, depth, depth=depth, top_k=top_k, budget=budget))
    return {"cases": cases}


def judge_tree(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        with torch.no_grad():
            head, features = ref_head(ref, case), ref["target_features"](case["tokens"][:-1])
        expected, rows = reference_scored(ref, ref["dynamic_tree"], head, features, list(case["tokens"]),
                                          depth=case["depth"], top_k=case["top_k"], budget=case["budget"])
        draft, scored = draft_of(answer)
        got = decode(draft)
        require(isinstance(got, list) and len(got) == 2, f"dynamic_tree should return (tokens, parents), got "
                                                         f"{show(got)}")
        tokens, parents = as_ints(got[0]), as_ints(got[1])
        label = (f"dynamic_tree after {case['tokens']} (depth={case['depth']}, top_k={case['top_k']}, "
                 f"budget={case['budget']})")
        require((tokens, parents) == (list(expected[0]), list(expected[1])),
                f"{label}: expected tokens {list(expected[0])} with parents {list(expected[1])}, got tokens "
                f"{tokens} with parents {parents}")
        require_scored(ref, scored, rows, label, "node expansion")


CHECKS = {
    "test_pairs": Check("eagle_training_pairs", fixed(PAIRS_VISIBLE), judge_pairs,
                        "eagle_training_pairs on the visible numbered case"),
    "test_pairs_hidden": Check("eagle_training_pairs", pairs_cases, judge_pairs,
                               "eagle_training_pairs on random features"),
    "test_head": Check("head_forward", head_visible, judge_head_visible,
                       "head_forward on the lab's prompt: all at once vs with the cache, tokens and values"),
    "test_head_hidden": Check("head_forward", head_cases, judge_head,
                              "head_forward against the reference, chunk by chunk into one cache, the lab's head "
                              "and untrained ones"),
    "test_chain": Check("eagle_chain", fixed(CHAIN_VISIBLE), judge_chain_visible,
                        "eagle_chain on the visible cases"),
    "test_chain_hidden": Check("eagle_chain", chain_cases, judge_chain,
                               "eagle_chain against the reference after random prompts, on the lab's head and "
                               "untrained ones: tokens and each step's probabilities"),
    "test_chain_loop": Check("chain_loop", loop_inputs(k=4),
                             judge_loop(2.5, 3.56, "EAGLE chain, k = 4", chain_drafter, "draft step"),
                             "eagle_chain in greedy speculative decoding: tau, and each step's probabilities"),
    "test_select": Check("select_nodes", fixed(SELECT_VISIBLE), judge_select, "select_nodes on the visible case"),
    "test_select_hidden": Check("select_nodes", select_cases, judge_select,
                                "select_nodes on a hand-made and random scored trees"),
    "test_dynamic_tree": Check("dynamic_tree", fixed(TREE_VISIBLE), judge_tree_visible,
                               "dynamic_tree on the visible case"),
    "test_dynamic_tree_hidden": Check("dynamic_tree", tree_cases, judge_tree,
                                      "dynamic_tree against the reference: deep trees, random prompts, the lab's "
                                      "head and untrained ones, tokens and probabilities"),
    "test_tree_loop": Check("tree_loop", loop_inputs(depth=4, top_k=3, budget=10),
                            judge_loop(2.4, 2.67, "EAGLE-2 tree, depth 4, top_k 3, budget 10", tree_drafter,
                                       "node expansion"),
                            "dynamic_tree in greedy speculative decoding: tau, and each step's probabilities"),
}
