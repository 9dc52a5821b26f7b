"""One model forward after a KV cache, eager or compiled: how the decode loops call a model.

Over a growing (dynamic) cache, a forward is the model's own call, as it always was. Over a static cache
(`specdec_lab.cache`, preallocated) the forward attends over the whole buffer: a 4-D mask lets each new token
see the cached prefix and the new tokens its visibility allows (causal for a chain, the tree mask for a tree),
and hides the unused tail. Its shapes then depend only on how many tokens are fed. With compiling on
(gpt-fast's lesson: a static cache and a compiled forward move decoding from overhead-bound to bandwidth-bound)
that number is padded up to a bucket of `QUERY_BUCKETS`, so a run compiles a handful of graphs (one token for
plain decoding and for a draft model, k + 1 for a chain's verification, a tree's node budget), not one per
length. The padding rows are scored and then dropped from the cache; causality (or the tree mask) keeps them
invisible to the real rows. A longer causal feed (a prompt's prefill) runs in chunks of the widest bucket, each
a compiled forward after the chunks before it (a chunked prefill, as serving engines do): no graph for every
prompt length, and the multiplies stay in the few-token kernels (`half_weights`) rather than going back to an
eager forward, whose Python costs a few milliseconds per call on the zoo target.

On CPU each shape's graph is compiled ahead, at its first call, and later calls go straight to it, past dynamo's
frame evaluation and guards (the caller fixes by the shape everything they would check). torch.compile keeps its
compiled code in inductor's on-disk cache, so a second process pays less than the first (it still traces each
shape: the README's warm-up lines give both); the first call of each shape says that it is compiling. On CUDA
the plan may ask for CUDA graphs (`mode="reduce-overhead"`): every call then marks a new step and its outputs are
copied out of the graph's buffers before the next call reuses them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from specdec_lab.cache import cache_length, is_static, truncate
from specdec_lab.filled_attention import use_filled_attention
from specdec_lab.half_weights import store_half_weights

QUERY_BUCKETS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # tokens per compiled forward (padded up to one of these)
REUSE_FACTOR = 3  # a compiled width is reused for feeds down to a third of it, rather than compiling another
MIN_RECOMPILE_LIMIT = 64  # graphs per model torch.compile may keep (buckets x cache lengths x hidden states)
# Inductor's C++ wrapper calls a graph's kernels from generated C++ rather than Python: about 1.3 ms less per
# one-token forward of the zoo target on 2 CPU threads (7.7 -> 6.1 ms), for a first compile two to three times
# longer (once per shape; inductor's on-disk cache keeps it for later processes). Not with CUDA graphs, which
# replay the kernels without the wrapper anyway (torch.compile takes a mode or options, not both).
WRAPPER_OPTIONS = {"cpp_wrapper": True}


@dataclass
class ForwardOutput:
    """What a forward returns: logits (1, keep, V) of the last `keep` fed tokens (all when keep is 0), and,
    when asked for, each layer's hidden states (1, q', H) of every fed token (embeddings first); q' >= q: a
    compiled forward's padding rows follow the fed ones (cutting 17 layers costs a step more than it saves)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


def query_bucket(tokens: int) -> int:
    """The padded length of a compiled forward of `tokens` tokens (itself, past the largest bucket)."""
    return next((size for size in QUERY_BUCKETS if size >= tokens), tokens)


def forward(model: torch.nn.Module, cache: Cache, tokens: torch.Tensor, visible: torch.Tensor | None = None,
            positions: torch.Tensor | None = None, keep: int = 0, hidden: bool = False) -> ForwardOutput:
    """Run `model` on `tokens` after its `cache` (appending their keys and values).

    tokens: (q,) ids; visible: (q, q) bool, which new tokens each new token may see (None: causal); positions:
    (q,) or (1, q) position ids (None: right after the cache); keep: return the logits of the last `keep`
    tokens only (0: all); hidden: also return every layer's hidden states.
    """
    past = cache_length(cache)
    if positions is not None:
        positions = positions.reshape(1, -1)
    if not is_static(cache):
        mask = None if visible is None else additive_mask_over(visible, past, past + len(tokens), model.dtype)
        out = model(input_ids=tokens[None], cache=cache, attention_mask=mask, position_ids=positions,
                    use_cache=True, output_hidden_states=hidden, logits_to_keep=keep)
        return ForwardOutput(out.logits, out.hidden_states if hidden else None)
    return static_forward(model, cache, tokens, visible, positions, keep, hidden)


def additive_mask_over(visible: torch.Tensor, past: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """The (1, 1, rows, width) additive mask: every row sees the `past` cached slots, row r sees new token c
    where `visible[r, c]` (at slot past + c); every other slot (the unused tail of a static cache) is hidden.
    `visible` may have more rows than columns: the extra rows (padding) see the prefix and themselves."""
    rows, columns = visible.shape
    allowed = torch.zeros(rows, width, dtype=torch.bool, device=visible.device)
    allowed[:, :past] = True
    allowed[:, past : past + columns] = visible
    extra = torch.arange(columns, rows, device=visible.device)
    allowed[extra, past + extra] = True
    mask = torch.zeros(allowed.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def causal_mask_over(rows: int, past: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`additive_mask_over` for a causal feed of `rows` tokens, built in three operations rather than eight (a
    decode step pays for it at every forward): every row sees the `past` cached slots and the new tokens up to
    its own."""
    mask = torch.full((rows, width), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, :past] = 0
    mask[:, past : past + rows].triu_(1)  # zero on and below the diagonal: token r sees new tokens 0..r
    return mask[None, None]


def static_forward(model, cache, tokens, visible, positions, keep, hidden) -> ForwardOutput:
    """`forward` over a static cache: padded to a bucket and compiled when the cache asks for it."""
    past, fed = cache_length(cache), len(tokens)
    length = cache.layers[0].max_cache_len
    if past + fed > length:
        raise RuntimeError(f"the static cache holds {length} positions; {past} are cached and {fed} more were "
                           "fed (the run's plan sized it too short)")
    compilable = (cache.compile and initialized(cache, model)
                  and (not hidden or capture_hooks_installed(model)))
    if compilable and fed > QUERY_BUCKETS[-1] and visible is None:
        return chunked_forward(model, cache, tokens, positions, keep, hidden)
    compiled = compilable and fed <= QUERY_BUCKETS[-1]
    width = compiled_width(model, cache.mode, fed, length, hidden) if compiled else fed
    if past + width > length:
        width = fed
    device = tokens.device
    if positions is None:
        positions = torch.arange(past, past + fed, device=device)[None]
    pad = width - fed
    if pad:  # padding repeats the last token at the last position: finite values, seen by no real row
        tokens = torch.cat([tokens, tokens[-1:].expand(pad)])
        positions = torch.cat([positions, positions[:, -1:].expand(1, pad)], dim=1)
        if visible is not None:
            visible = torch.cat([visible, visible.new_zeros(pad, fed)])
    # The model's compute dtype: its cache's once allocated (`model.dtype` walks the parameters at every call)
    dtype = cache.layers[0].keys.dtype if compilable else model.dtype
    if visible is None:  # causal over the padded width: padding rows come last, so no real row sees them
        mask = causal_mask_over(width, past, length, dtype, device)
    else:
        mask = additive_mask_over(visible, past, length, dtype)
    if compiled:
        tokens, positions = tokens.long(), positions.long()  # a graph compiled ahead checks no dtypes
    inputs = dict(input_ids=tokens[None], attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                  output_hidden_states=hidden, logits_to_keep=0 if compiled else keep)
    out = run_compiled(model, cache.mode, (width, length, hidden), inputs) if compiled else model(**inputs)
    logits = out.logits[:, :fed] if compiled else out.logits
    if compiled and keep:
        logits = logits[:, -keep:]
    states = out.hidden_states if hidden else None  # padding rows included: callers pick the rows they keep
    if compiled and cache.mode == "reduce-overhead":  # the graph's output buffers are reused by its next replay
        logits = logits.clone()
        states = tuple(h.clone() for h in states) if hidden else None
    if pad:
        truncate(cache, past + fed)
    return ForwardOutput(logits, states)


def initialized(cache: Cache, model: torch.nn.Module) -> bool:
    """Whether the static `cache`'s buffers exist, allocating them for `model` if it says their shape (its
    key-value heads and head size). A compiled forward must never allocate them itself: that graph would be
    called again, by shape, once they exist. False leaves the first forward eager (it allocates them)."""
    if all(layer.is_initialized for layer in cache.layers):
        return True
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (heads and config.hidden_size // config.num_attention_heads)
    if not isinstance(heads, int) or not isinstance(head_dim, int):
        return False
    cache.early_initialization(1, heads, head_dim, model.dtype, next(model.parameters()).device)
    return True


def capture_hooks_installed(model: torch.nn.Module) -> bool:
    """Whether transformers has put its hidden-state capturing hooks on `model`: it does so at the first call
    that asks for hidden states, under a lock that a compiled graph cannot take, so that call must run eager."""
    if not model.__dict__.get("_specdec_hooks_installed"):
        model.__dict__["_specdec_hooks_installed"] = any(
            getattr(module, "_output_capturing_hooks_installed", False) for module in model.modules())
    return model.__dict__["_specdec_hooks_installed"]


def chunked_forward(model, cache, tokens, positions, keep, hidden) -> ForwardOutput:
    """A causal `static_forward` of more tokens than the widest bucket: chunks of QUERY_BUCKETS[-1] tokens (the
    last one shorter), each after the ones before it; the hidden states hold the fed rows only."""
    width = QUERY_BUCKETS[-1]
    parts = []
    for start in range(0, len(tokens), width):
        chunk_positions = None if positions is None else positions[:, start : start + width]
        parts.append(static_forward(model, cache, tokens[start : start + width], None, chunk_positions, 0, hidden))
    logits = torch.cat([part.logits for part in parts], dim=1)
    states = None
    if hidden:  # each chunk's rows past its fed tokens (its logits' rows) are padding: cut them before joining
        states = tuple(torch.cat([part.hidden_states[layer][:, : part.logits.shape[1]] for part in parts], dim=1)
                       for layer in range(len(parts[0].hidden_states)))
    return ForwardOutput(logits[:, -keep:] if keep else logits, states)


def compiled_width(model: torch.nn.Module, mode: str | None, fed: int, length: int, hidden: bool) -> int:
    """How many tokens a compiled forward of `fed` tokens runs: the narrowest width already compiled for this
    model and cache length that is at most REUSE_FACTOR times `fed` (a chain's last, shorter drafts reuse the
    graph of its full verification), else `fed`'s bucket."""
    shapes = [shape for (kind, _), (_, graphs) in model.__dict__.get("_specdec_compiled", {}).items()
              if kind == mode for shape in graphs]
    widths = [w for w, n, h in shapes if isinstance(w, int) and n == length and h == hidden  # (not a batch's)
              and fed <= w <= REUSE_FACTOR * fed]
    return min(widths, default=query_bucket(fed))


def compiled_function(model: torch.nn.Module, mode: str | None, ahead: bool = False):
    """`model.forward` through torch.compile, and the graphs compiled from it so far (shape -> callable): one
    per model, mode and way of calling, kept on the model.

    ahead: the graphs are compiled ahead of their calls, one per shape (`run_compiled`), and carry no guards;
    otherwise dynamo picks a graph at every call by its guards (`compiled_forward`)."""
    store = model.__dict__.setdefault("_specdec_compiled", {})
    if (mode, ahead) not in store:
        if mode is None:  # on CPU: float16 copies of float16-exact weights, attention over the filled slots
            store_half_weights(model)
            use_filled_attention(model)
        limits = torch._dynamo.config
        limits.recompile_limit = max(limits.recompile_limit, MIN_RECOMPILE_LIMIT)
        options = {"guard_filter_fn": no_guards if ahead else unguarded_buffers}
        settings = {"mode": mode, "options": options} if mode else {"options": {**WRAPPER_OPTIONS, **options}}
        function = torch.compile(own_code(model.forward), fullgraph=True, dynamic=False, **settings)
        store[mode, ahead] = (function, {})
    return store[mode, ahead]


def compiled_forward(model: torch.nn.Module, mode: str | None, shape: tuple):
    """`model.forward` through torch.compile with dynamo's dispatch: each call's guards pick its graph (a batch's
    forwards, whose inputs are not all fixed by their shape). shape: the call's shape (tokens fed, cache
    length, ...): the first call of each says that it is compiling."""
    function, graphs = compiled_function(model, mode)
    if shape not in graphs:
        announce_compiling(model, shape)
        graphs[shape] = function
    return function


def run_compiled(model: torch.nn.Module, mode: str | None, shape: tuple[int, int, bool], inputs: dict):
    """Run `model.forward(**inputs)` compiled, for a caller that fixes every input but the tensors' values by
    `shape` (tokens fed, cache length, hidden states wanted), as `static_forward` does.

    On CPU each shape's graph is compiled ahead at its first call (dynamo's `aot_compile`) and later calls go
    straight to it: no frame evaluation, cache lookup or guards, which cost about 0.1 ms of a 0.57 ms one-token
    forward of the zoo draft. With CUDA graphs dynamo dispatches, its guards skipped for a shape seen before."""
    if mode is not None:
        seen = shape in compiled_function(model, mode)[1]
        function = compiled_forward(model, mode, shape)
        torch.compiler.cudagraph_mark_step_begin()
        return without_guards(function, **inputs) if seen else function(**inputs)
    function, graphs = compiled_function(model, mode, ahead=True)
    if shape not in graphs:
        announce_compiling(model, shape)
        graph = function.aot_compile(((), inputs))
        graph.disable_guard_check()  # the shape picked it: the caller fixes everything the guards would check
        graphs[shape] = graph
    return graphs[shape](**inputs)


def announce_compiling(model: torch.nn.Module, shape: tuple) -> None:
    """Say on stderr that the first call of `shape` (tokens fed, cache length, ...) is compiling."""
    tokens, length = shape[:2]
    print(f"specdec: compiling {type(model).__name__}'s forward for {tokens} tokens over a {length}-slot "
          "cache (first call of this shape; inductor's on-disk cache makes later processes faster)",
          file=sys.stderr, flush=True)


def own_code(method):
    """`method` (a bound forward) behind a function with a code object of its own. Dynamo keeps compiled graphs
    per code object and, at every call, looks for the graph whose guards pass among all of them: every model of
    one class (a draft and its target, both Llama) shares `forward`'s code, so each call of one would also
    check the other's graphs, and the recompile limit (`MIN_RECOMPILE_LIMIT`) would count all their graphs."""
    def call(**inputs):
        return method(**inputs)

    call.__code__ = call.__code__.replace(co_name=f"forward_of_{type(method.__self__).__name__}_{id(method):x}")
    return call


def unguarded_buffers(guards) -> list[bool]:
    """torch.compile's guard filter for a forward: keep every guard but the tensor checks on the float16 weight
    copies (`half_weights`) and on the static cache's buffers. Dynamo always checks the shape, strides and
    dtype of every tensor that is not an `nn.Parameter`, even where the caller fixes them (about 150 tensors of
    the zoo target, most of a compiled forward's guard time): the copies never change once stored, and a cache's
    length, dtype and device are fixed by the mask and the model, whose own guards remain."""
    return [not (guard.guard_type == "TENSOR_MATCH"
                 and ("['cache']." in guard.name or "weight_packed" in guard.name
                      or "weight_half" in guard.name))
            for guard in guards]


def no_guards(guards) -> list[bool]:
    """torch.compile's guard filter for graphs compiled ahead (`run_compiled`): none kept, as their caller picks
    them by shape."""
    return [False] * len(guards)


def without_guards(function, **inputs):
    """Call a compiled function on inputs of a shape it has already compiled, checking only the guards that
    tell its graphs apart. Dynamo's full guard check costs about 0.3 ms a call on the zoo target (measured
    with torch.profiler: "TorchDynamo Cache Lookup", a tenth of a compiled one-token forward); it is skipped
    only where `run_compiled` knows the shape was compiled and the caller fixes every other input by the
    shape, so no call can need a graph that the differentiating guards would not pick."""
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        return function(**inputs)
