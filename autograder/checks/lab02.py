"""Checks of lab 2 (the decode loop): drafting that samples from the q it reports, at the target's temperature;
cache rollback; a step that is lossless even with a draft that differs from the target; EOS; the formulas; alpha
and tau measured apart from one run of the loop. The trusted side recomputes every distribution from its own copy
of the lab's models (the reference solution's setup), so nothing the student's kernel did to its models changes
what is expected; where a check asks what a run did (its forwards, how many drafts it kept), the models are served
from here and the run is counted here."""

from __future__ import annotations

import torch

from autograder.checks._common import (
    Check,
    Fail,
    as_float,
    as_int,
    as_ints,
    as_tensor,
    chi_square_pvalue,
    decode,
    fixed,
    greedy_tokens,
    histogram,
    isclose,
    require,
    require_close,
    show,
)

P_VALUE = 1e-6
PROMPT = [5, 17, 42, 8, 23, 61, 3]  # the lab's own prompt (visible tests)
VOCAB = 64
MEASURE_STEPS = 12  # steps of the run whose alpha and tau are measured
MEASURE_NOISE = 0.003  # the lab's own draft noise: on a new target it keeps some first drafts and rejects others


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of `model` at every position of `tokens`, without any cache (the ground truth)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].double()


def hidden_target(seed: int, ref: dict):
    """A target of the lab's construction from a seed the sandbox never sees."""
    target = ref["tiny_llama"](seed=seed, hidden=48, layers=2)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # sharp, like the lab's target
    return target


def served_pair(inputs: dict, ref: dict) -> dict:
    """A hidden target and a draft identical to it: every drafted token is then accepted, so a real speculative
    loop emits k + 1 tokens per target forward."""
    import copy

    target = hidden_target(inputs["secret"]["target_seed"], ref)
    return {"target": target, "draft": copy.deepcopy(target)}


def noisy_pair(secret: dict, ref: dict) -> dict:
    """A hidden target and a draft made from it the way the lab makes its own (`noisy_copy`, from another hidden
    seed): it keeps some drafted tokens and rejects others."""
    target = hidden_target(secret["target_seed"], ref)
    return {"target": target, "draft": ref["noisy_copy"](target, seed=secret["draft_seed"], noise=MEASURE_NOISE)}


def noisy_served_pair(inputs: dict, ref: dict) -> dict:
    return noisy_pair(inputs["secret"], ref)


def hidden_target_seed(generator: torch.Generator) -> dict:
    return {"target_seed": 100_000 + seed_of(generator) % 100_000}


def random_context(generator: torch.Generator, length: int = 6) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def seed_of(generator: torch.Generator) -> int:
    return int(torch.randint(0, 2**30, (1,), generator=generator))


def judge_draft_visible(inputs: dict, answers: list, ref: dict) -> None:
    case, got = inputs["cases"][0], decode(answers[0])
    tokens = as_ints(got["tokens"])
    expected = greedy_tokens(ref["draft_model"], case["context"], case["k"])
    require(tokens == expected, f"at temperature 0 the draft is greedy: expected {expected}, got {tokens}")
    q = as_tensor(got["q"], (case["k"], VOCAB))
    expected_cache = len(case["context"]) + case["k"] - 1
    require(got["cache"] == expected_cache, f"after drafting {case['k']} tokens after {len(case['context'])} pending "
                                            f"ones the cache should hold {expected_cache} positions, it holds "
                                            f"{got['cache']}")
    require(all(float(q[i, t]) == 1 for i, t in enumerate(tokens)),
            f"at temperature 0, q should be one-hot at each drafted token; drafted {tokens}, q puts "
            f"{show([float(q[i, t]) for i, t in enumerate(tokens)])} on them")
    judge_temperature({"cases": inputs["cases"][1:]}, answers[1:], ref)  # the visible case at temperature 0.5


def sampling_inputs(generator: torch.Generator, ref: dict) -> dict:
    return {"context": random_context(generator), "temperature": 1.5, "n": 400, "seed": seed_of(generator)}


def judge_sampling(inputs: dict, answer: dict, ref: dict) -> None:
    t = inputs["temperature"]
    q = torch.softmax(full_logits(ref["draft_model"], inputs["context"])[-1] / t, dim=-1)
    require_close(answer["q"], q, f"the q reported at temperature {t} (softmax of the draft's logits / {t})",
                  atol=1e-4)
    counts = histogram(as_ints(answer["tokens"]), VOCAB)
    pvalue = chi_square_pvalue(counts, q)
    require(pvalue > P_VALUE, f"over {inputs['n']} one-token drafts at temperature {t}, the drafted tokens are not "
                              f"distributed as the draft's q (chi-square p-value {pvalue:.1e}): the token must be "
                              "sampled from the q you return")


def temperature_inputs(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"context": random_context(generator), "k": 3, "temperature": 0.5,
                       "seed": seed_of(generator)}]}


def judge_temperature(inputs: dict, answers: list, ref: dict) -> None:
    case, got = inputs["cases"][0], decode(answers[0])
    tokens, k, t = as_ints(got["tokens"]), case["k"], case["temperature"]
    require(len(tokens) == k, f"draft(k={k}) should return {k} tokens, got {tokens}")
    logits = full_logits(ref["draft_model"], case["context"] + tokens[:-1])[-k:]
    require_close(got["q"], torch.softmax(logits / t, dim=-1),
                  f"the q rows at temperature {t} (softmax of the draft's logits / {t} at each drafted position)",
                  atol=1e-4)


def judge_step_visible(inputs: dict, answer: dict, ref: dict) -> None:
    for number, after in enumerate(answer["steps"], start=1):
        emitted, tokens = as_ints(after["emitted"]), as_ints(after["tokens"])
        require(1 <= len(emitted) <= inputs["k"] + 1 and tokens[-len(emitted):] == emitted,
                f"step {number}: a step emits 1 to {inputs['k'] + 1} tokens and appends them to dec.tokens; "
                f"emitted {emitted}")
        require(after["target_cache"] == len(tokens) - 1, f"step {number}: the target cache should hold all tokens "
                                                          f"but the last ({len(tokens) - 1}), it holds "
                                                          f"{after['target_cache']}")
    new = as_ints(answer["steps"][-1]["tokens"])[len(inputs["context"]):]
    expected = greedy_tokens(ref["target"], inputs["context"], len(new))
    require(new == expected, f"at temperature 0 the output is the target's greedy decoding: expected {expected}, "
                             f"got {new}")


def other_draft(generator: torch.Generator) -> dict:
    """A draft unrelated to the target (rejected often), built in the sandbox from these two numbers."""
    return {"draft_seed": 1000 + seed_of(generator) % 10_000, "draft_sharpness": 4.0}


def step_inputs(generator: torch.Generator, ref: dict) -> dict:
    return {"context": random_context(generator), "temperature": 0.0, "seed": 0, "steps": 8, "k": 3,
            **other_draft(generator), "perfect": {"context": random_context(generator), "steps": 3, "k": 3},
            "secret": hidden_target_seed(generator)}


def judge_step_cache(inputs: dict, answer: dict, ref: dict) -> None:
    judge_cache_run(inputs, answer, ref)
    perfect, forwards = inputs["perfect"], inputs["measured"]["forwards"]
    for number, after in enumerate(answer["perfect"], start=1):
        emitted = as_ints(after)
        require(len(emitted) == perfect["k"] + 1, f"with a draft identical to the target every drafted token is "
                                                  f"accepted, so step {number} should emit k + 1 = "
                                                  f"{perfect['k'] + 1} tokens; it emitted {emitted} (does the step "
                                                  "draft and verify?)")
    ran = [f["tokens"] for f in forwards["target"]]
    require(len(ran) == 1 + perfect["steps"] and len(forwards["draft"]) >= perfect["steps"],
            f"a prefill and {perfect['steps']} steps should run the target {1 + perfect['steps']} times (one "
            f"verification forward per step) and draft in every step; the target ran {len(ran)} times (on "
            f"{ran} tokens), the draft {len(forwards['draft'])} times")


def judge_cache_run(inputs: dict, answer: dict, ref: dict) -> None:
    for number, after in enumerate(answer["steps"], start=1):
        length = len(as_ints(after["tokens"]))
        require(after["target_cache"] == length - 1, f"after step {number} the target cache holds "
                                                     f"{after['target_cache']} positions but the decoder has {length} "
                                                     "tokens (it must hold all but the last)")
        require(as_int(after["draft_cache"]) <= length, f"after step {number} the draft cache holds "
                                                        f"{after['draft_cache']} positions, more than the {length} "
                                                        "tokens: it kept rejected tokens")
    new = as_ints(answer["steps"][-1]["tokens"])[len(inputs["context"]):]
    expected = greedy_tokens(ref["target"], inputs["context"], len(new))
    require(new == expected, f"at temperature 0, after {inputs['steps']} steps the tokens should be plain greedy "
                             f"decoding of the target {expected}, got {new}")


def lossless_inputs(generator: torch.Generator, ref: dict) -> dict:
    return {"context": random_context(generator), "temperature": 0.5, "n": 400, "k": 2, "seed": seed_of(generator),
            **other_draft(generator)}


def judge_lossless(inputs: dict, answer: dict, ref: dict) -> None:
    target, t = ref["target"], inputs["temperature"]
    first = int(full_logits(target, inputs["context"])[-1].argmax())
    p = torch.softmax(full_logits(target, inputs["context"] + [first])[-1] / t, dim=-1)
    counts = histogram(as_ints(answer["tokens"]), VOCAB)
    pvalue = chi_square_pvalue(counts, p)
    if pvalue <= P_VALUE:
        raise Fail(f"with a draft model that differs from the target, the first token of a step at temperature {t} "
                   f"is not distributed as the target's p over {inputs['n']} steps (chi-square p-value "
                   f"{pvalue:.1e}): verification must compare the target's p with the draft's q")


def eos_inputs(generator: torch.Generator, ref: dict) -> dict:
    context = random_context(generator)
    reference = greedy_tokens(ref["target"], context, 24)
    stop = max(i for i in range(24) if reference[i] not in reference[:i])  # the last first-appearance
    return {"cases": [  # rollback with a rejected draft; EOS mid-step; a served pair that counts forwards
        {"prompt": context, "max_new_tokens": 9, "k": 4, **other_draft(generator)},
        {"prompt": context, "max_new_tokens": 24, "k": 4, "eos": reference[stop]},
        {"prompt": random_context(generator), "max_new_tokens": 24, "k": 4, "served": True}],
        "secret": {"reference": reference, "stop": stop, **hidden_target_seed(generator)}}


def judge_eos(inputs: dict, answers: list, ref: dict) -> None:
    reference, stop = inputs["secret"]["reference"], inputs["secret"]["stop"]
    plain_run, eos_run, served_run = (decode(a) for a in answers)
    require(isinstance(plain_run, list) and len(plain_run) == 2, f"generate should return (tokens, forwards), got "
                                                                 f"{show(plain_run)}")
    new = as_ints(plain_run[0])
    require(new == reference[:9], f"generate(max_new_tokens=9) should return the first 9 greedy tokens "
                                  f"{reference[:9]}, got {new}")
    new = as_ints(eos_run[0])
    require(new == reference[: stop + 1], f"with eos={reference[stop]} the output should stop right after it: "
                                          f"expected {reference[: stop + 1]}, got {new}")
    judge_served_generate(inputs, inputs["cases"][2], served_run, ref)


def judge_served_generate(inputs: dict, case: dict, run, ref: dict) -> None:
    """On the served pair (a draft identical to a hidden target) the output is the target's greedy decoding,
    the forwards reported are the forwards the target ran, and they are as few as speculation allows."""
    require(isinstance(run, list) and len(run) == 2, f"generate should return (tokens, forwards), got {show(run)}")
    n, k = case["max_new_tokens"], case["k"]
    target = served_pair(inputs, ref)["target"]
    new, reported = as_ints(run[0]), as_int(run[1])
    expected = greedy_tokens(target, case["prompt"], n)
    require(new == expected, f"generate({case['prompt']}, {n}, k={k}) on a new target with a draft identical to it: "
                             f"expected its greedy tokens {expected}, got {new}")
    ran = len(inputs["measured"]["forwards"]["target"])
    require(reported == ran, f"generate reported {reported} target forwards; the target ran {ran} times")
    fewest = 1 + -(-(n - 1) // (k + 1))  # the prefill, then k + 1 tokens per verification forward
    require(ran <= fewest + 1, f"with every drafted token accepted, {n} tokens take {fewest} target forwards "
                               f"(k = {k}); yours took {ran}: does each step verify all k drafted tokens in one "
                               "forward?")


def generate_visible_inputs(generator: torch.Generator, ref: dict) -> dict:
    expected = greedy_tokens(ref["target"], PROMPT, 12)
    return {"cases": [{"prompt": PROMPT, "max_new_tokens": 12, "k": 3},
                      {"prompt": PROMPT, "max_new_tokens": 12, "k": 3, "eos": expected[4]}],
            "secret": {"expected": expected}}


def judge_generate_visible(inputs: dict, answers: list, ref: dict) -> None:
    expected = inputs["secret"]["expected"]
    got = decode(answers[0])
    require(isinstance(got, list) and len(got) == 2, f"generate should return (tokens, forwards), got {show(got)}")
    new, forwards = as_ints(got[0]), as_int(got[1])
    require(new == expected, f"expected the 12 greedy tokens {expected}, got {new}")
    require(1 <= forwards <= 12, f"12 tokens take 1 to 12 target forwards, got {forwards}")
    stop = expected.index(expected[4])
    new = as_ints(decode(answers[1])[0])
    require(new == expected[: stop + 1], f"with eos={expected[4]}, expected {expected[: stop + 1]}, got {new}")


def formula_inputs(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"alpha": 0.5, "k": 3, "c": 0.1}, {"alpha": 1.0, "k": 4, "c": 0.1}, {"alpha": 0.8, "k": 4, "c": 0.1}]
    for _ in range(3):
        cases.append({"alpha": round(float(torch.rand(1, generator=generator)) * 0.9 + 0.05, 3),
                      "k": int(torch.randint(1, 9, (1,), generator=generator)),
                      "c": round(float(torch.rand(1, generator=generator)) * 0.5, 3)})
    return {"cases": cases}


def judge_formulas(inputs: dict, answer: dict, ref: dict) -> None:
    for case, tokens, speedup in zip(inputs["cases"], answer["tokens"], answer["speedup"], strict=True):
        a, k, c = case["alpha"], case["k"], case["c"]
        expected = ref["expected_tokens_per_step"](a, k)
        got = as_float(tokens)
        require(isclose(got, expected), f"expected_tokens_per_step(alpha={a}, k={k}): expected {expected:.6g}, "
                                        f"got {got:.6g}")
        expected = ref["expected_speedup"](a, k, c)
        got = as_float(speedup)
        require(isclose(got, expected), f"expected_speedup(alpha={a}, k={k}, c={c}): expected {expected:.6g}, "
                                        f"got {got:.6g}")


def judge_formulas_visible(inputs: dict, answer: dict, ref: dict) -> None:
    """Exactly the visible cell's three assertions (the speedup only at alpha = 0.5)."""
    got = as_float(answer["tokens"][0])
    require(isclose(got, 1.875, 1e-9), f"alpha = 0.5, k = 3: 1 + 0.5 + 0.25 + 0.125 = 1.875 tokens, got {got}")
    got = as_float(answer["tokens"][1])
    require(isclose(got, 5.0, 1e-9), f"alpha = 1, k = 4: every draft kept plus the bonus, 5 tokens, got {got}")
    got = as_float(answer["speedup"][0])
    require(isclose(got, 1.875 / 1.75, 1e-9), f"alpha = 0.5, k = 3, c = 0.25: 1.875 / (3 * 0.25 + 1), got {got}")


def greedy_step_lengths(pair: dict, prompt: list[int], steps: int, k: int) -> list[int]:
    """How many tokens each of `steps` greedy speculative steps emits after `prompt` on `pair` (k drafted per
    step), worked out here from the models themselves without any cache: the counts a correct loop's run has."""
    reference = greedy_tokens(pair["target"], prompt, steps * (k + 1) + 1)
    done, lengths = 1, []  # start() emits the first token
    for _ in range(steps):
        drafted = greedy_tokens(pair["draft"], prompt + reference[:done], k)
        kept = next((i for i, token in enumerate(drafted) if token != reference[done + i]), k)
        lengths.append(kept + 1)
        done += kept + 1
    return lengths


def informative(lengths: list[int], k: int) -> bool:
    """Whether a run tells alpha apart from the other counts one could mistake for it: some step kept its first
    drafted token and rejected a later one, so accepted / drafted < alpha and tau > 1."""
    return any(2 <= n <= k for n in lengths)


def measure_inputs(generator: torch.Generator, ref: dict) -> dict:
    """A hidden noisy pair, a prompt and k whose greedy run is informative (redrawn until it is, a few times)."""
    k = int(torch.randint(3, 6, (1,), generator=generator))
    for _ in range(20):
        secret = {"target_seed": 100_000 + seed_of(generator) % 100_000,
                  "draft_seed": 200_000 + seed_of(generator) % 100_000}
        prompt = random_context(generator)
        lengths = greedy_step_lengths(noisy_pair(secret, ref), prompt, MEASURE_STEPS, k)
        if informative(lengths, k):
            break
    return {"prompt": prompt, "steps": MEASURE_STEPS, "k": k, "secret": {**secret, "lengths": lengths}}


def alpha_and_tau(answer) -> tuple[float, float]:
    got = decode(answer)
    require(isinstance(got, list) and len(got) == 2, f"measure_alpha_and_tau should return (alpha, tau), got "
                                                     f"{show(got)}")
    return as_float(got[0]), as_float(got[1])


def judge_measure(inputs: dict, answer, ref: dict) -> None:
    """One run on the served noisy pair: as many target forwards as one run makes, and the alpha and tau of that
    run, whose counts were worked out here (the trusted side) from the hidden models."""
    steps, k, lengths = inputs["steps"], inputs["k"], inputs["secret"]["lengths"]
    alpha, tau = alpha_and_tau(answer)
    ran = [f["tokens"] for f in inputs["measured"]["forwards"]["target"]]
    require(len(ran) == 1 + steps, f"one run of {steps} steps is a prefill and {steps} verification forwards of the "
                                   f"target; the target ran {len(ran)} times (on {show(ran)} tokens): alpha and tau "
                                   "must both come from the one run of your loop")
    kept, emitted = sum(n >= 2 for n in lengths), sum(lengths)
    hint = " (that is accepted / drafted over all positions; alpha is the first drafted position's rate)" \
        if isclose(alpha, (emitted - steps) / (k * steps)) and kept * k != emitted - steps else ""
    require(isclose(alpha, kept / steps), f"on a new target and draft ({k} tokens drafted per step), greedy "
                                          f"speculative decoding keeps the first drafted token in {kept} of the "
                                          f"{steps} steps, so alpha = {kept / steps:.4g}; you returned "
                                          f"{alpha:.4g}{hint}")
    hint = " (the prefill is not a step)" if isclose(tau, (1 + emitted) / (1 + steps)) else ""
    require(isclose(tau, emitted / steps), f"in that run the {steps} steps emit {emitted} tokens, so tau = "
                                           f"{emitted / steps:.4g}; you returned {tau:.4g}{hint}")


def judge_measure_visible(inputs: dict, answers: list, ref: dict) -> None:
    """Exactly the visible cell's assertions (10 steps at k = 1, then at k = 4)."""
    alpha, tau = alpha_and_tau(answers[0])
    require(0 <= alpha <= 1 and abs(alpha * 10 - round(alpha * 10)) < 1e-9,
            f"alpha is a share of the 10 steps (kept first drafts / 10), got {alpha}")
    require(abs(tau - (1 + alpha)) < 1e-9, f"with k = 1 a step emits 2 tokens when its drafted token is kept and 1 "
                                           f"otherwise, so tau = 1 + alpha = {1 + alpha:.2f}; got tau = {tau}")
    alpha, tau = alpha_and_tau(answers[1])
    require(1 + alpha - 1e-9 <= tau <= 1 + 4 * alpha + 1e-9,
            f"a step that keeps its first draft emits 2 to 5 tokens, one that does not emits 1: tau must lie between "
            f"1 + alpha = {1 + alpha:.2f} and 1 + 4 alpha = {1 + 4 * alpha:.2f}; got alpha = {alpha}, tau = {tau}")


CHECKS = {
    "test_draft": Check("draft", fixed({"cases": [{"context": PROMPT, "k": 4, "temperature": 0.0, "seed": 0},
                                                  {"context": PROMPT, "k": 3, "temperature": 0.5, "seed": 1}]}),
                        judge_draft_visible, "draft on the visible cases (k = 4 at temperature 0, k = 3 at 0.5)"),
    "test_draft_sampling_hidden": Check("draft_samples", sampling_inputs, judge_sampling,
                                        "draft samples its token from the q it returns (temperature 1.5)"),
    "test_draft_temperature_hidden": Check("draft", temperature_inputs, judge_temperature,
                                           "draft's q rows at temperature 0.5"),
    "test_step": Check("step", fixed({"context": PROMPT, "temperature": 0.0, "seed": 0, "steps": 3, "k": 3}),
                       judge_step_visible, "speculative_step on the visible case"),
    "test_step_cache_hidden": Check("step_checked", step_inputs, judge_step_cache,
                                    "both caches after each of 8 steps with a draft the target often rejects, "
                                    "the greedy output, and one verification forward per step (with a draft "
                                    "that is always accepted)", serve=served_pair),
    "test_step_lossless_hidden": Check("first_tokens", lossless_inputs, judge_lossless,
                                       "a step samples the target's distribution (temperature 0.5, a different "
                                       "draft model)"),
    "test_generate": Check("generate", generate_visible_inputs, judge_generate_visible,
                           "generate on the visible cases (12 greedy tokens, and an EOS)"),
    "test_generate_eos_hidden": Check("generate", eos_inputs, judge_eos,
                                      "generate with a draft the target often rejects, stopping after an EOS in "
                                      "the middle of a step, and the target forwards it reports (counted where "
                                      "the target runs)", serve=served_pair),
    "test_formulas": Check("formulas", fixed({"cases": [{"alpha": 0.5, "k": 3, "c": 0.25},
                                                        {"alpha": 1.0, "k": 4, "c": 0.25}]}),
                           judge_formulas_visible, "the formulas on the visible cases"),
    "test_formulas_hidden": Check("formulas", formula_inputs, judge_formulas,
                                  "the formulas at alpha = 1, the bonus token, and random settings"),
    "test_measure": Check("measure", fixed({"cases": [{"prompt": PROMPT, "steps": 10, "k": 1},
                                                      {"prompt": PROMPT, "steps": 10, "k": 4}]}),
                          judge_measure_visible, "measure_alpha_and_tau on the visible cases (10 steps, k = 1 and 4)"),
    "test_measure_hidden": Check("measure_served", measure_inputs, judge_measure,
                                 "alpha (the first drafted token's acceptance) and tau of one run of your loop on a "
                                 "new target and draft, against that run's counts (made where the models run)",
                                 serve=noisy_served_pair),
}
