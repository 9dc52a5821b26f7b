"""Multi-token prediction (DeepSeek-V3, arXiv 2412.19437, section 2.2): one small module per draft depth.

MTP sits between Medusa (K parallel heads on the same feature, no recurrence) and EAGLE (one head reused
autoregressively): it chains K *different* modules. Module d (d = 1..K) at position i reads the previous
depth's hidden state h^(d-1)_i (depth 0: the target's last hidden state, the final-normed feature the decode
loop returns) and the embedding of token x_(i+d), and predicts token x_(i+d+1):

    h'_i   = W_d [RMSNorm(h^(d-1)_i) ; RMSNorm(Emb(x_(i+d)))]          # 2H -> H
    h^d    = Block_d(h'_0 .. h'_i)                                      # one Llama decoder layer, causal
    P^d_i  = softmax(lm_head(FinalNorm(h^d_i)))                         # the target's own, frozen

Emb, FinalNorm and lm_head are borrowed from the target (frozen, never saved with the modules).

Drafting. With x_0 .. x_n verified (x_n emitted, not yet in the target's cache) and the target's features at
positions 0 .. n-1, module d has seen every position i whose inputs are all verified: i + d <= n. Module 1 at
position n-1 (feature h^0_(n-1), token x_n) therefore predicts the first draft token x_(n+1) from verified
inputs alone. Module d at position n-1 reads its own drafted input x_(n+d-1) and module d-1's output at n-1;
its causal attention also wants positions n-d+1 .. n-2, whose inputs are drafted too, so depth d feeds those
d-1 positions (speculative rows, dropped from its cache at the next commit) in one forward. Every module
thus attends over exactly the positions it was trained on, with drafted tokens standing in for the unknown
future: the draft equals a teacher-forced pass over the context plus the draft (`tests/test_mtp.py` checks
it), which is also what `specdec_lab.train.mtp` trains. K modules draft at most K tokens.

Verification: each token is drawn from its module's processed q (temperature / top-k / top-p as for the
target) and handed to the chain rule with q, so sampling is lossless; at temperature 0 the argmax is drafted
and the output equals plain greedy decoding.

Modules are saved as a small folder: `config.json` (an `MTPConfig`) and `model.safetensors` (fp16).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specdec_lab.cache import new_cache, truncate
from specdec_lab.drafters.base import DecodeState, Draft, Drafter, check_verification
from specdec_lab.drafters.eagle import LayerShape, additive_mask, causal_allowed
from specdec_lab.sampling import draw

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class MTPConfig(LayerShape):
    """Shape of the MTP modules (each one decoder layer of the target's shape) and how many there are.

    The target's layer shape and vocabulary come from `LayerShape`; num_modules: K, the draft depth; card:
    measured figures saved with the modules (e.g. per-depth acceptance).
    """

    num_modules: int = 3
    card: dict = field(default_factory=dict)

    @classmethod
    def from_target(cls, target: nn.Module, num_modules: int = 3) -> MTPConfig:
        """The config of `num_modules` modules that fit `target`."""
        return cls(**LayerShape.of_target(target), num_modules=num_modules)


def depth_inputs(window: torch.Tensor, depth: int) -> torch.Tensor:
    """The tokens module `depth` reads at positions 0, 1, ... of a window (B, L + 1): x_(i+depth)."""
    return window[:, depth:]


def depth_labels(window: torch.Tensor, depth: int) -> torch.Tensor:
    """The tokens module `depth` predicts at positions 0, 1, ... of a window (B, L + 1): x_(i+depth+1), one
    fewer than it reads (its last position's next token lies beyond the window)."""
    return window[:, depth + 1 :]


class MTPModule(nn.Module):
    """One MTP depth: RMSNorm of the incoming hidden state and of the token embedding, a 2H -> H projection of
    their concatenation, one Llama decoder layer."""

    def __init__(self, layer_config: LlamaConfig):
        super().__init__()
        hidden, eps = layer_config.hidden_size, layer_config.rms_norm_eps
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.embed_norm = LlamaRMSNorm(hidden, eps=eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = LlamaDecoderLayer(layer_config, layer_idx=0)  # each module keeps a one-layer cache of its own


class MTPHeads(nn.Module):
    """K sequential MTP modules on a frozen target; module d (1-based) predicts the token d + 1 positions ahead.

    They borrow the target's embedding, final norm and lm_head (frozen, not submodules, never saved): call
    `attach(target)` before use (`load` does). `forward(depth, ...)` runs one module; `logits` maps its
    output hidden states to token scores.
    """

    def __init__(self, config: MTPConfig):
        super().__init__()
        if config.num_modules < 1 or config.hidden_size < 1:
            raise ValueError(f"MTP needs at least one module and a positive hidden size, got "
                             f"num_modules={config.num_modules}, hidden_size={config.hidden_size}")
        self.config = config
        self.layer_config = config.llama_config()
        self.mtp = nn.ModuleList(MTPModule(self.layer_config) for _ in range(config.num_modules))
        self.rotary = LlamaRotaryEmbedding(self.layer_config)
        self._borrowed: tuple[nn.Module, nn.Module, nn.Module] | None = None  # (embedding, final norm, lm_head)

    @property
    def num_modules(self) -> int:
        return self.config.num_modules

    def attach(self, target: nn.Module) -> MTPHeads:
        """Borrow `target`'s embedding, final norm and lm_head; move the modules to its device and dtype."""
        tc, mc = target.config, self.config
        if (tc.hidden_size, tc.vocab_size) != (mc.hidden_size, mc.vocab_size):
            raise ValueError(f"these MTP modules were made for a target with hidden size {mc.hidden_size} and "
                             f"vocabulary {mc.vocab_size}; the given target has hidden size {tc.hidden_size} and "
                             f"vocabulary {tc.vocab_size}: use the target's own modules")
        final_norm = getattr(target.base_model, "norm", None)
        if final_norm is None:
            raise ValueError(f"MTP needs the target's final norm (`model.norm`); {type(target).__name__} has none")
        self._borrowed = (target.get_input_embeddings(), final_norm, target.get_output_embeddings())
        weight = self._borrowed[2].weight
        return self.to(device=weight.device, dtype=weight.dtype)

    def attached_to(self, target: nn.Module) -> bool:
        """Whether the borrowed parts are `target`'s."""
        return self._borrowed is not None and self._borrowed[2] is target.get_output_embeddings()

    def _target_parts(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        if self._borrowed is None:
            raise RuntimeError("the MTP modules are not attached to a target: call heads.attach(target) first")
        return self._borrowed

    def forward(self, depth: int, hidden: torch.Tensor, tokens: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        """Output hidden states h^depth (B, T, H) of module `depth` (1-based).

        hidden: (B, T, H) h^(depth-1) at the T positions (depth 1: the target's last hidden state); tokens:
        (B, T) the token `depth` places after each position; position_ids: (B, T); attention_mask: additive
        (1 or B, 1, T, past + T); cache: the module's own KV cache (appended to), or None.
        """
        module = self.mtp[depth - 1]
        embed = self._target_parts()[0]
        x = torch.cat([module.hidden_norm(hidden), module.embed_norm(embed(tokens).to(hidden.dtype))], dim=-1)
        x = module.proj(x)
        return module.layer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                            use_cache=cache is not None, position_embeddings=self.rotary(x, position_ids))

    def teacher_forced(self, hidden: torch.Tensor, window: torch.Tensor) -> list[torch.Tensor]:
        """Every module over a window of known tokens, in one causal pass each (what training computes).

        hidden: (B, >= L, H) the target's last hidden state at positions 0 .. L-1; window: (B, L + 1) tokens
        x_0 .. x_L. Returns, for depth d = 1..K, module d's outputs (B, L + 1 - d, H) at positions 0 .. L - d
        (every position whose input token x_(i+d) lies in the window; module d + 1 reads the first L - d).
        """
        length = window.shape[1] - 1
        features, outputs = hidden[:, :length], []
        for depth in range(1, self.num_modules + 1):
            tokens = depth_inputs(window, depth)
            count = tokens.shape[1]
            if count < 1:
                break
            positions = torch.arange(count, device=window.device)[None].expand(window.shape[0], -1)
            mask = additive_mask(causal_allowed(count, 0, window.device), features.dtype)
            features = self(depth, features[:, :count], tokens, positions, mask)
            outputs.append(features)
        return outputs

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Token scores of module outputs: the target's lm_head after the target's final norm."""
        _, final_norm, lm_head = self._target_parts()
        return lm_head(final_norm(hidden))

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for one module's layer (a growing one: the modules' masks cover the cached length)."""
        return new_cache(self.layer_config, allow_static=False)

    def init_from_target_layer(self, target: nn.Module, index: int = -1) -> None:
        """Warm start for training: every module's decoder layer copies target layer `index`."""
        for module in self.mtp:
            module.layer.load_state_dict(target.model.layers[index].state_dict())

    def save(self, folder: str | Path) -> None:
        """Write `config.json` and fp16 `model.safetensors` into `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"model_type": "mtp_heads", **asdict(self.config)}, indent=2) + "\n"
        (folder / CONFIG_NAME).write_text(text)
        state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME))

    @classmethod
    def load(cls, folder: str | Path, target: nn.Module) -> MTPHeads:
        """Read modules saved by `save` and attach them to `target` (weights upcast to its dtype), in eval mode.

        Raises FileNotFoundError for a missing folder or file, ValueError for a config or weights file that
        cannot be read, weights that do not match the config, or a target of another shape; each names the
        file and the problem.
        """
        folder = Path(folder)
        missing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"no MTP heads in {folder}: {' and '.join(missing)} missing (expected "
                                    f"{CONFIG_NAME} and {WEIGHTS_NAME}; train them with `specdec train mtp`)")
        try:
            data = json.loads((folder / CONFIG_NAME).read_text())
            data.pop("model_type", None)
            known = {f.name for f in fields(MTPConfig)}
            unknown = sorted(set(data) - known)
            if unknown:
                raise TypeError(f"unknown fields {unknown}")
            config = MTPConfig(**data)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{folder / CONFIG_NAME} is not an MTP config: {error}") from None
        try:
            weights = load_file(str(folder / WEIGHTS_NAME))
        except Exception as error:  # safetensors raises its own error type for truncated or foreign files
            raise ValueError(f"cannot read {folder / WEIGHTS_NAME} (truncated or not safetensors?): {error}") from None
        heads = cls(config)
        try:
            heads.load_state_dict({k: v.float() for k, v in weights.items()})
        except RuntimeError as error:
            raise ValueError(f"{folder / WEIGHTS_NAME} does not match its {CONFIG_NAME} "
                             f"({config.num_modules} modules of hidden size {config.hidden_size}): {error}") from None
        return heads.attach(target).eval()


class MTPDrafter(Drafter):
    """Drafts a chain with MTP modules: depth d's token from module d (see the module docstring).

    heads: `MTPHeads` (attached on `start` to the target they are used with); depth: tokens per draft
    (default: one per module, at most `heads.num_modules`); verification: "token" (`verify.verify_rejection`)
    or "block" (`verify.verify_block`) for sampling runs; greedy runs match argmaxes either way.

    The target's hidden states come from the decode loop (`needs_hidden_states`), as for Medusa and EAGLE:
    after every verification `state.hidden_states[-1]` holds the final-normed features of the positions just
    accepted, which `commit` feeds to module 1, and module 1's outputs to module 2, and so on.
    """

    needs_hidden_states = True

    def __init__(self, heads: MTPHeads, depth: int | None = None, verification: str = "token"):
        depth = heads.num_modules if depth is None else depth
        if not isinstance(depth, int) or not 1 <= depth <= heads.num_modules:
            raise ValueError(f"depth must be an integer from 1 to {heads.num_modules} (one token per MTP module), "
                             f"got {depth!r}")
        self.heads = heads
        self.depth = depth
        self.verification = check_verification(verification)
        self.caches: list[DynamicCache] = []
        # committed[d - 1]: positions module d has seen with verified inputs (a prefix 0 .. committed - 1).
        self.committed: list[int] = []
        # tails[d - 1]: module d's output at its last verified position (1, H), the next depth's input there.
        self.tails: list[torch.Tensor] = []
        self.first_logits: torch.Tensor | None = None  # module 1 at the last verified position: draft token 1

    @classmethod
    def from_pretrained(cls, folder: str | Path, target: nn.Module, **kwargs) -> MTPDrafter:
        """A drafter from modules saved in `folder` for `target`; kwargs as for the class."""
        return cls(MTPHeads.load(folder, target), **kwargs)

    def start(self, state: DecodeState) -> None:
        if not self.heads.attached_to(state.target):
            self.heads.attach(state.target)
        self.caches = [self.heads.new_cache() for _ in range(self.heads.num_modules)]
        self.committed = [0] * self.heads.num_modules
        hidden, dtype = self.heads.config.hidden_size, state.target.get_output_embeddings().weight.dtype
        self.tails = [torch.empty(0, hidden, device=state.device, dtype=dtype) for _ in range(self.heads.num_modules)]
        self._absorb(state)

    def commit(self, state: DecodeState, accepted: int) -> None:
        # Drop every module's speculative rows of the last draft, then feed the newly verified positions.
        for cache, committed in zip(self.caches, self.committed, strict=True):
            truncate(cache, committed)
        self._absorb(state)

    def _run(self, depth: int, hidden: torch.Tensor, tokens: list[int], start: int,
             device: torch.device) -> torch.Tensor:
        """Module `depth` on positions start .. start + len(tokens) - 1 after its cache (which holds `start`
        positions); returns their outputs (T, H)."""
        count = len(tokens)
        positions = torch.arange(start, start + count, device=device)[None]
        mask = additive_mask(causal_allowed(count, start, device), hidden.dtype)
        ids = torch.tensor(tokens, device=device)[None]
        return self.heads(depth, hidden[None], ids, positions, mask, self.caches[depth - 1])[0]

    def _absorb(self, state: DecodeState) -> None:
        """Feed every module the positions whose inputs are now all verified (module d: i + d <= n)."""
        n = len(state.tokens) - 1
        features = state.hidden_states[-1]  # the target's features at positions committed[0] .. n - 1
        if features.shape[0] != n - self.committed[0]:
            raise RuntimeError(f"MTP expected the target features of {n - self.committed[0]} new positions, got "
                               f"{features.shape[0]}")
        inputs, first = features.to(self.tails[0].dtype), self.committed[0]  # h^(d-1) rows from position `first`
        for depth in range(1, self.heads.num_modules + 1):
            start, end = self.committed[depth - 1], max(0, n - depth + 1)
            tail = self.tails[depth - 1]
            if end > start:
                rows = inputs[start - first : end - first]
                out = self._run(depth, rows, state.tokens[start + depth : end + depth], start, state.device)
                self.committed[depth - 1] = end
                outputs, first = torch.cat([tail, out]), start - len(tail)
            else:
                outputs, first = tail, start - len(tail)
            self.tails[depth - 1] = outputs[-1:]
            inputs = outputs
        self.first_logits = self.heads.logits(self.tails[0][-1]).float()

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        k = min(self.depth, max_tokens)
        n = len(state.tokens) - 1
        extended = list(state.tokens)  # the verified tokens, then the draft as it grows
        tokens, probs = [], []
        logits = self.first_logits
        # Module 1's outputs at positions first .. n - 1 (here only n - 1, which it has seen verified).
        previous, first = self.tails[0], n - 1
        for depth in range(1, k + 1):
            if depth > 1:
                start = self.committed[depth - 1]
                rows = previous[start - first :]
                out = self._run(depth, rows, extended[start + depth : n + depth], start, state.device)
                logits = self.heads.logits(out[-1]).float()
                # The next depth reads this module's outputs from its last verified position on.
                previous = torch.cat([self.tails[depth - 1], out])
                first = start - len(self.tails[depth - 1])
            token, q = draw(logits, state.sampling, state.generator)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            extended.append(int(token))
        return Draft(torch.stack(tokens), torch.stack(probs) if probs else None, info={"depth": k},
                     verification=self.verification)
