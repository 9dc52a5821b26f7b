"""Checks of lab 5 (drafting without a draft model): prompt lookup (longest suffix first, most recent earlier
occurrence, the key being the last tokens), Jacobi iteration run to its fixed point (greedy tokens and the exact
number of forwards), the lookahead window's n-grams, a pool that refreshes repeats and drops the least recent,
candidates keyed by the last token, and one lookahead forward's layout (the exact attention mask, and every row's
logits against sequential decoding on the trusted copy of the lab's target). Hidden cases are drawn per run;
fixed cases that each classic mistake fails are always included."""

from __future__ import annotations

import torch

from autograder.checks._common import (
    Check,
    Fail,
    as_int,
    as_ints,
    as_tensor,
    decode,
    fixed,
    greedy_tokens,
    require,
    serve_case_models,
    show,
)

VOCAB = 32
PROMPT = [3, 14, 15, 9, 26, 5, 3, 14, 8, 9, 7, 9]  # the lab's own prompt (visible tests)


def randint(generator: torch.Generator, low: int, high: int) -> int:
    """One integer in [low, high)."""
    return int(torch.randint(low, high, (1,), generator=generator))


def tokens_of(generator: torch.Generator, n: int, alphabet: int) -> list[int]:
    return torch.randint(0, alphabet, (n,), generator=generator).tolist()


def pair_of(value, what: str) -> list:
    got = decode(value)
    require(isinstance(got, list) and len(got) == 2, f"{what} should return a pair, got {show(got)}")
    return got


# ----------------------------------------------------------------------------------------------- prompt lookup


def lookup_visible() -> dict:
    return {"cases": [
        {"tokens": [1, 2, 3, 4, 1, 2, 5, 6, 7, 1, 2], "max_ngram": 2, "k": 3, "min_ngram": 1},
        {"tokens": [4, 5, 6, 1, 2, 3, 9, 5, 6, 7, 0, 4, 5, 6], "max_ngram": 3, "k": 2, "min_ngram": 1},
        {"tokens": [1, 2, 3], "max_ngram": 2, "k": 4, "min_ngram": 1}]}


def lookup_cases(generator: torch.Generator, ref: dict) -> dict:
    # Fixed cases: the suffix itself is not an earlier occurrence; the key is the LAST n tokens; min_ngram counts.
    cases = [{"tokens": [7, 1, 2, 7, 3, 1, 2], "max_ngram": 2, "k": 3, "min_ngram": 1},
             {"tokens": [5, 9, 9, 5, 9, 8, 5, 9], "max_ngram": 3, "k": 2, "min_ngram": 1},
             {"tokens": [3, 1, 4, 1, 5, 9, 2, 6, 5, 4], "max_ngram": 3, "k": 3, "min_ngram": 2}]
    for _ in range(6):  # small alphabets repeat n-grams often
        length, alphabet = randint(generator, 8, 30), randint(generator, 3, 7)
        cases.append({"tokens": tokens_of(generator, length, alphabet), "max_ngram": randint(generator, 1, 5),
                      "k": randint(generator, 1, 6), "min_ngram": 1})
    return {"cases": cases}


def judge_lookup(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["prompt_lookup"](case["tokens"], case["max_ngram"], case["k"], case["min_ngram"])
        got = as_ints(answer)
        require(got == expected, f"prompt_lookup({case['tokens']}, max_ngram={case['max_ngram']}, k={case['k']}, "
                                 f"min_ngram={case['min_ngram']}): expected {expected}, got {got}")


# ----------------------------------------------------------------------------------------------- suffix decoding


def suffix_visible() -> dict:
    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    return {"cases": [{"tokens": tokens, "k": 6, "max_match": 2, "factor": 2.0, "min_probability": 0.1},
                      {"tokens": tokens, "k": 6, "max_match": 2, "factor": 2.0, "min_probability": 0.7},
                      {"tokens": tokens, "k": 6, "max_match": 1, "factor": 2.0, "min_probability": 0.1},
                      {"tokens": [1, 2, 3], "k": 4, "max_match": 8, "factor": 2.0, "min_probability": 0.1}]}


def suffix_cases(generator: torch.Generator, ref: dict) -> dict:
    """Fixed cases where the most frequent follower is not the most recent one, where a tie is broken by recency,
    and where the budget or the probability ends the draft; then random sequences over small alphabets (repeated
    strings with several continuations each), at random budgets, factors and probability floors."""
    cases = [{"tokens": [5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6], "k": 4, "max_match": 2, "factor": 2.0,
              "min_probability": 0.1},
             {"tokens": [4, 1, 2, 4, 1, 3, 4, 1], "k": 3, "max_match": 2, "factor": 1.0, "min_probability": 0.0},
             {"tokens": [9, 9, 9, 9, 9, 9, 9], "k": 8, "max_match": 8, "factor": 2.0, "min_probability": 0.1},
             # 2/3, then 2/3 again, then a tie at 1/2: the floor of 0.5 ends the draft after three tokens
             {"tokens": [5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6], "k": 6, "max_match": 2, "factor": 2.0,
              "min_probability": 0.5}]
    for _ in range(9):
        length, alphabet = randint(generator, 16, 40), randint(generator, 2, 5)
        cases.append({"tokens": tokens_of(generator, length, alphabet), "k": randint(generator, 1, 9),
                      "max_match": randint(generator, 1, 6), "factor": [1.0, 1.5, 2.0][randint(generator, 0, 3)],
                      "min_probability": [0.0, 0.1, 0.3][randint(generator, 0, 3)]})
    return {"cases": cases}


def judge_suffix(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        settings = {key: case[key] for key in ("k", "max_match", "factor", "min_probability")}
        expected = ref["suffix_draft"](list(case["tokens"]), **settings)
        got = as_ints(answer)
        shown_settings = ", ".join(f"{key}={value}" for key, value in settings.items())
        require(got == expected, f"suffix_draft({case['tokens']}, {shown_settings}): expected {expected}, got {got}")


# ----------------------------------------------------------------------------------------------- Jacobi


def judge_jacobi_visible(inputs: dict, answers: list, ref: dict) -> None:
    case = inputs["cases"][0]
    got = pair_of(answers[0], "jacobi_decode")
    tokens, iterations = as_ints(got[0]), as_int(got[1])
    expected = ref["greedy"](case["prompt"], case["n"])
    require(tokens == expected, f"jacobi_decode(PROMPT, {case['n']}): the fixed point is greedy decoding, expected "
                                f"{expected}, got {tokens}")
    require(1 <= iterations <= case["n"] + 1, f"{case['n']} tokens take 1 to {case['n'] + 1} forwards, got "
                                              f"{iterations}")


def jacobi_cases(generator: torch.Generator, ref: dict) -> dict:
    # The fixed case, on the lab's own target, changes a single token one forward before its fixed point: a loop
    # that stops once an iteration changes at most one token reports one forward too few there. The others run
    # on models of the lab's construction from seeds the sandbox never sees. All are served: their forwards are
    # counted on the trusted side.
    cases, seeds = [{"prompt": [25, 5, 16, 2, 10, 25, 5, 16], "n": 8}], [0]
    for _ in range(4):
        cases.append({"prompt": tokens_of(generator, randint(generator, 4, 12), VOCAB), "n": randint(generator, 5, 11)})
        seeds.append(randint(generator, 1, 10_000))
    return {"cases": cases, "secret": {"seeds": seeds}}


@torch.no_grad()
def jacobi_forwards(model, prompt: list[int], n: int) -> int:
    """Forwards that Jacobi iteration from `n` copies of the last prompt token takes to its fixed point on
    `model`, the confirming forward included (the lab's definition)."""
    guesses, forwards = [prompt[-1]] * n, 0
    while True:
        logits = model(input_ids=torch.tensor([prompt + guesses])).logits[0]
        refined = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
        forwards += 1
        if refined == guesses:
            return forwards
        guesses = refined


def judge_jacobi(inputs: dict, answers: list, ref: dict) -> None:
    for index, (case, answer) in enumerate(zip(inputs["cases"], answers, strict=True)):
        got = pair_of(answer, "jacobi_decode")
        tokens, iterations = as_ints(got[0]), as_int(got[1])
        model = ref["tiny_llama"](inputs["secret"]["seeds"][index])
        prompt, n = case["prompt"], case["n"]
        expected = greedy_tokens(model, prompt, n)
        label = f"jacobi_decode({prompt}, n={n}) on {'the lab' if index == 0 else 'a new'} model"
        require(tokens == expected, f"{label}: expected the greedy tokens {expected}, got {tokens} (stopped before "
                                    "the fixed point?)")
        forwards = inputs["measured"]["forwards"][f"case{index}"]
        require(iterations == len(forwards), f"{label}: you reported {iterations} forwards, the target ran "
                                             f"{len(forwards)} times")
        narrow = [f["past"] + f["tokens"] for f in forwards if f["past"] + f["tokens"] < len(prompt) + n - 1]
        require(not narrow, f"{label}: a Jacobi iteration scores the whole window of {n} guesses in one forward; "
                            f"{len(narrow)} of your forwards saw only {sorted(set(narrow))} positions (one token "
                            "at a time is plain greedy decoding)")
        wanted = jacobi_forwards(model, prompt, n)
        require(iterations == wanted, f"{label}: iterating from {n} copies of the last prompt token reaches the "
                                      f"fixed point in {wanted} forwards (the last one confirms it), yours took "
                                      f"{iterations}")


# ----------------------------------------------------------------------------------------------- window


def window_visible() -> dict:
    return {"cases": [{"levels": [[1, 2, 3]], "new_guesses": [4, 5, 6], "ngram": 3},
                      {"levels": [[1, 2, 3], [4, 5, 6]], "new_guesses": [7, 8, 9], "ngram": 3}]}


def window_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for full in (True, True, False, True):
        width, ngram = randint(generator, 2, 7), randint(generator, 2, 6)
        depth = ngram - 1 if full else randint(generator, 1, max(2, ngram - 1))
        cases.append({"levels": [tokens_of(generator, width, VOCAB) for _ in range(depth)],
                      "new_guesses": tokens_of(generator, width, VOCAB), "ngram": ngram})
    return {"cases": cases}


def judge_window(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        levels = [list(level) for level in case["levels"]]
        expected_levels, expected_ngrams = ref["advance_window"](levels, list(case["new_guesses"]), case["ngram"])
        got = pair_of(answer, "advance_window")
        got_levels, got_ngrams = decode(got[0]), decode(got[1])
        label = (f"advance_window(levels={case['levels']}, new_guesses={case['new_guesses']}, "
                 f"ngram={case['ngram']})")
        require(isinstance(got_ngrams, list), f"{label}: the n-grams should be a list, got {show(got_ngrams)}")
        ngrams = [as_ints(g) for g in got_ngrams]
        require(ngrams == expected_ngrams, f"{label}: expected the n-grams {expected_ngrams}, got {ngrams}")
        require(isinstance(got_levels, list), f"{label}: the levels should be a list, got {show(got_levels)}")
        got_levels = [as_ints(level) for level in got_levels]
        require(got_levels == expected_levels, f"{label}: expected the levels {expected_levels}, got {got_levels}")


# ----------------------------------------------------------------------------------------------- pool


def read_pool(snapshot, label: str, tuples: bool = False) -> dict[int, list[list[int]]]:
    """The student's pool from the probe's snapshot (keys as ints, continuations as lists)."""
    snapshot = decode(snapshot)
    require(isinstance(snapshot, dict) and "entries" in snapshot, f"{label}: the pool should be a dict, got "
                                                                  f"{show(snapshot)}")
    if tuples:
        require(snapshot["tuples"], f"{label}: store each continuation as a tuple")
    return {int(key): [as_ints(c) for c in value] for key, value in snapshot["entries"].items()}


def expected_pool(ref: dict, batches: list, size: int, upto: int) -> dict[int, list[list[int]]]:
    pool: dict = {}
    for batch in batches[: upto + 1]:
        ref["update_pool"](pool, [list(ngram) for ngram in batch], size)
    return {key: [list(c) for c in value] for key, value in pool.items()}


def pool_visible() -> dict:
    return {"batches": [[[1, 2, 3], [1, 4, 5], [2, 3, 4]], [[1, 6, 7]]], "size": 2, "tokens": [9, 2, 1],
            "max_len": 2}


def judge_pool_visible(inputs: dict, answer, ref: dict) -> None:
    got = decode(answer)
    require(isinstance(got, dict) and "pools" in got, f"the pool test's answer could not be read: {show(got)}")
    for number, snapshot in enumerate(got["pools"]):
        expected = expected_pool(ref, inputs["batches"], inputs["size"], number)
        pool = read_pool(snapshot, "update_pool", tuples=True)
        require(pool == expected, f"after update_pool({inputs['batches'][number]}, size={inputs['size']}) the pool "
                                  f"should be {expected}, got {pool}")
    candidates = [as_ints(c) for c in decode(got["candidates"])]
    expected_pool_now = expected_pool(ref, inputs["batches"], inputs["size"], len(inputs["batches"]) - 1)
    wanted = [c[: inputs["max_len"]] for c in expected_pool_now.get(inputs["tokens"][-1], [])]
    require(candidates == wanted, f"select_candidates(pool, {inputs['tokens']}, max_len={inputs['max_len']}): "
                                  f"the candidates after the last token ({inputs['tokens'][-1]}): expected {wanted}, "
                                  f"got {candidates}")


def stale_cases(generator: torch.Generator, ref: dict) -> dict:
    # Fixed: a repeated n-gram becomes the most recent again, so it outlives an older one.
    cases = [{"batches": [[[1, 2, 3]], [[1, 4, 5]], [[1, 2, 3]], [[1, 6, 7]]], "size": 2}]
    for _ in range(3):
        ngram, size = randint(generator, 2, 5), randint(generator, 1, 4)
        batches = [[tokens_of(generator, ngram, 3) for _ in range(randint(generator, 1, 5))] for _ in range(6)]
        cases.append({"batches": batches, "size": size})
    return {"cases": cases}


def judge_stale(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        snapshots = decode(answer)
        require(isinstance(snapshots, list) and len(snapshots) == len(case["batches"]),
                f"update_pool: expected one pool per batch of n-grams, got {show(snapshots)}")
        for number, snapshot in enumerate(snapshots):
            expected = expected_pool(ref, case["batches"], case["size"], number)
            pool = read_pool(snapshot, "update_pool")
            history = case["batches"][: number + 1]
            require(pool == expected, f"update_pool with size={case['size']}, after adding the batches {history} "
                                      f"in order: expected the pool {expected}, got {pool} (most recent first, a "
                                      "repeat becomes the most recent, at most size per key)")


def candidates_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for _ in range(4):
        ngram = randint(generator, 3, 6)
        pool: dict = {}
        ref["update_pool"](pool, [tokens_of(generator, ngram, 5) for _ in range(12)], 3)
        tokens = tokens_of(generator, randint(generator, 2, 6), 5)
        cases.append({"pool": {str(k): [list(c) for c in v] for k, v in pool.items()}, "tokens": tokens,
                      "max_len": randint(generator, 1, ngram)})
    # fixed: the last token and the one before it both have candidates
    cases.append({"pool": {"1": [[2, 3]], "2": [[4, 5], [6, 7]]}, "tokens": [0, 2, 1], "max_len": 1})
    return {"cases": cases}


def judge_candidates(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        pool = {int(key): [tuple(c) for c in value] for key, value in case["pool"].items()}
        expected = ref["select_candidates"](pool, case["tokens"], case["max_len"])
        got = decode(answer)
        require(isinstance(got, list), f"select_candidates should return a list, got {show(got)}")
        got = [as_ints(c) for c in got]
        require(got == expected, f"select_candidates(pool={case['pool']}, tokens={case['tokens']}, "
                                 f"max_len={case['max_len']}): expected {expected}, got {got}")


# ----------------------------------------------------------------------------------------------- layout


def read_layout(answer, rows: int, label: str) -> tuple[list[int], torch.Tensor]:
    got = pair_of(answer, "lookahead_layout")
    offsets = as_ints(got[0])
    require(len(offsets) == rows, f"{label}: expected {rows} offsets (one per row), got {len(offsets)}: {offsets}")
    require(all(0 <= o < 128 for o in offsets), f"{label}: offsets out of range: {offsets}")
    visible = decode(got[1])
    if isinstance(visible, list):
        visible = torch.tensor(visible)
    visible = as_tensor(visible, (rows, rows))
    require(visible.dtype == torch.bool, f"{label}: visible should be a bool tensor, got {visible.dtype}")
    return offsets, visible


def describe_row(row: int, lengths: list[int], width: int) -> str:
    if row == 0:
        return "the root"
    start = 1
    for number, length in enumerate(lengths):
        if row < start + length:
            return f"candidate {number}'s token at depth {row - start + 1}"
        start += length
    level, column = divmod(row - start, width)
    return f"the window row at level {level}, column {column}"


def layout_visible() -> dict:
    return {"cases": [{"lengths": [2, 1], "width": 3, "levels": 2}], "context": PROMPT[:-1],
            "rows": [PROMPT[-1], 4, 7, 5, 1, 2, 3, 11, 12, 13]}


def layout_mask_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"lengths": [2, 2], "width": 3, "levels": 2}]
    for _ in range(3):
        cases.append({"lengths": [randint(generator, 1, 5) for _ in range(randint(generator, 1, 4))],
                      "width": randint(generator, 1, 6), "levels": randint(generator, 1, 4)})
    return {"cases": cases}


def judge_layout_mask(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected_offsets, expected = ref["lookahead_layout"](case["lengths"], case["width"], case["levels"])
        label = f"lookahead_layout({case['lengths']}, width={case['width']}, levels={case['levels']})"
        _, visible = read_layout(answer, len(expected_offsets), label)
        for row in range(len(expected)):
            if not torch.equal(visible[row], expected[row]):
                wanted, seen = expected[row].nonzero().flatten().tolist(), visible[row].nonzero().flatten().tolist()
                raise Fail(f"{label}: row {row} ({describe_row(row, case['lengths'], case['width'])}) should see "
                           f"the rows {wanted}, yours sees {seen}")


def row_texts(lengths: list[int], width: int, levels: int, rows: list[int]) -> list[list[int]]:
    """The tokens each row continues (after the context), in position order: what sequential decoding feeds."""
    texts, start = [[rows[0]]], 1
    for length in lengths:
        texts += [[rows[0]] + rows[start : start + depth + 1] for depth in range(length)]
        start += length
    for level in range(levels):
        for column in range(width):
            lower = [rows[start + below * width + column] for below in range(1, level + 1)]
            texts.append([rows[0]] + rows[start : start + column + 1] + lower)
    return texts


def judge_layout_sequential(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        rows, context = case["rows"], case["context"]
        label = f"lookahead_layout({case['lengths']}, width={case['width']}, levels={case['levels']})"
        offsets, visible = read_layout(answer, len(rows), label)
        if "offsets" in case:
            require(offsets == case["offsets"], f"{label}: expected the offsets {case['offsets']}, got {offsets}")
        with torch.no_grad():
            got = ref["masked_logits"](context, rows, offsets, visible)
            for row, text in enumerate(row_texts(case["lengths"], case["width"], case["levels"], rows)):
                expected = ref["logits_of"](context + text)[-1]
                gap = float((got[row] - expected).abs().max())
                require(gap < 1e-4, f"{label}: row {row} ({describe_row(row, case['lengths'], case['width'])}, "
                                    f"token {rows[row]}) should continue the context + {text}; in one forward with "
                                    f"your offsets and mask its logits differ from sequential decoding by {gap:.3g}")


def layout_visible_sequential() -> dict:
    case = layout_visible()
    return {"cases": [case["cases"][0] | {"context": case["context"], "rows": case["rows"],
                                          "offsets": [0, 1, 2, 1, 1, 2, 3, 2, 3, 4]}]}


def layout_sequential_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for shape in ((2, 3, 2), None, None):  # the first has several levels and columns: offsets are not row indices
        lengths = [randint(generator, 1, 4) for _ in range(randint(generator, 1, 4))]
        width, levels = randint(generator, 2, 6), randint(generator, 1, 4)
        if shape is not None:
            lengths, width, levels = [shape[0]] * 2, shape[1], shape[2]
        rows = tokens_of(generator, 1 + sum(lengths) + width * levels, VOCAB)
        cases.append({"lengths": lengths, "width": width, "levels": levels, "rows": rows,
                      "context": tokens_of(generator, randint(generator, 3, 12), VOCAB)})
    return {"cases": cases}


CHECKS = {
    "test_lookup": Check("prompt_lookup", fixed(lookup_visible()), judge_lookup, "prompt_lookup on the visible cases"),
    "test_lookup_hidden": Check("prompt_lookup", lookup_cases, judge_lookup,
                                "prompt_lookup on hand-made and random token lists (the key is the last n tokens, "
                                "the most recent earlier occurrence wins)"),
    "test_suffix": Check("suffix_draft", fixed(suffix_visible()), judge_suffix,
                         "suffix_draft on the visible cases"),
    "test_suffix_hidden": Check("suffix_draft", suffix_cases, judge_suffix,
                                "suffix_draft on hand-made cases (frequency against recency, ties, budget, "
                                "probability floor) and random repetitive sequences"),
    "test_jacobi": Check("jacobi_decode", fixed({"cases": [{"prompt": PROMPT, "n": 8}]}), judge_jacobi_visible,
                         "jacobi_decode on the visible case"),
    "test_jacobi_hidden": Check("jacobi_decode_served", jacobi_cases, judge_jacobi,
                                "jacobi_decode on random prompts and new models: the greedy tokens and the forwards "
                                "to the fixed point, counted where the model runs", serve=serve_case_models),
    "test_window": Check("advance_window", fixed(window_visible()), judge_window,
                         "advance_window on the visible cases"),
    "test_window_hidden": Check("advance_window", window_cases, judge_window,
                                "advance_window on random windows (the n-gram of column i starts at level 0)"),
    "test_pool": Check("pool_and_candidates", fixed(pool_visible()), judge_pool_visible,
                       "update_pool and select_candidates on the visible case"),
    "test_pool_stale_hidden": Check("update_pool", stale_cases, judge_stale,
                                    "update_pool on random n-gram streams (repeats refreshed, least recent dropped)"),
    "test_candidates_hidden": Check("select_candidates", candidates_cases, judge_candidates,
                                    "select_candidates on random pools (keyed by the last token)"),
    "test_layout": Check("lookahead_layout", fixed(layout_visible_sequential()), judge_layout_sequential,
                         "lookahead_layout on the visible case, against sequential decoding"),
    "test_layout_mask_hidden": Check("lookahead_layout", layout_mask_cases, judge_layout_mask,
                                     "lookahead_layout's attention mask on random shapes (the branches never see "
                                     "each other)"),
    "test_layout_sequential_hidden": Check("lookahead_layout", layout_sequential_cases, judge_layout_sequential,
                                           "one lookahead forward with your layout, row by row against sequential "
                                           "decoding (random shapes and tokens)"),
}
