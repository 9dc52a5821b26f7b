"""EAGLE (Li et al. 2024): draft in the target's feature space with one light decoder layer.

The head reads the target's feature f_t at position t together with the embedding of the token x_{t+1}
that follows it, and predicts the next feature; the target's own frozen lm_head turns a predicted feature
into a token distribution. Drafting unrolls the head on its own predictions:

    f, x = f_n, x_{n+1}                      # the last verified feature and the last emitted token
    repeat depth times:
        f = head(fc([f ; embed(x)]))          # one decoder layer with its own KV cache
        q = softmax(lm_head(f));  x ~ q       # (argmax when greedy; top-k children in tree mode)

Which feature. transformers 5.24 returns `hidden_states[-1]` AFTER the target's final RMSNorm. We use that
normed feature (the paper's "feature before the LM head"), not the pre-norm residual stream, because
(1) it is exactly what lm_head reads, so lm_head(predicted feature) is the draft distribution with no extra
norm to learn or copy; (2) the norm fixes its scale, so the smooth-L1 regression is well conditioned (the
pre-norm residual stream carries a few very large dimensions that would dominate the loss); (3) the decode
loop already returns it, so no forward hook is needed.

Modes of `EagleDrafter`:

- "chain" (EAGLE-1): `depth` tokens, one per step, verified by the chain rules (sampled tokens carry q);
  with `min_confidence`, the chain stops early before a token the head is unsure of (adaptive length,
  lossless because the decision depends on q alone, as for `DraftModelDrafter`); with
  `verification="block"`, sampling runs verify the chain jointly (`specdec_lab.verify.verify_block`).
- "tree" (EAGLE-2): a dynamic tree. Depth 1 holds the `top_k` most likely tokens; at every further depth
  the `top_k` newest nodes with the highest cumulative log-probability are expanded (one batched head
  forward with a tree mask over the head's cache), each into its `top_k` most likely children. Finally all
  nodes are reranked by cumulative log-probability and the best `total_tokens` form the draft tree. A
  child's cumulative log-probability never exceeds its parent's, so the kept set is closed under ancestors.
  That is the greedy tree. When sampling, the tree's children are by default *drawn* from the head's q
  without replacement into a shape fixed in advance (`children="sampled"`, see `EagleDrafter`); the
  EAGLE-2 construction at temperature > 0 stays available as `children="top"`.

The EAGLE-3 direction is the same head with `feature_layers` naming several target layers (low, middle,
high): their features are concatenated and fused by a linear layer into the head's input feature. It is
trained with training-time test (`specdec_lab.train.eagle`): unrolled on its own outputs, as it drafts.

A head is saved as a small folder: `config.json` (an `EagleConfig`) and `model.safetensors` (fp16).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specdec_lab.cache import new_cache, truncate
from specdec_lab.drafters.base import DecodeState, Draft, Drafter, check_verification
from specdec_lab.drafters.draft_model import check_confidence
from specdec_lab.sampling import SamplingConfig, confidence, draw, process_logits, sample_without_replacement
from specdec_lab.tree import sampled_tree_shape

MODES = ("chain", "tree")
CHILDREN = ("sampled", "top")
LAYOUTS = ("course", "vllm")


@dataclass
class LayerShape:
    """The shape of one decoder layer of a target, for the light drafters that borrow it (EAGLE heads, MTP modules).

    hidden_size / intermediate_size / num_heads / num_kv_heads / head_dim / rms_norm_eps / rope_theta /
    max_position_embeddings: the target layer's shape; vocab_size: the target's vocabulary (for checks);
    target_layers: how many layers the target has.
    """

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    target_layers: int

    @staticmethod
    def of_target(target: nn.Module) -> dict:
        """The shape fields of `target`'s layers, as keyword arguments for a config that extends this one."""
        tc = target.config
        rope = getattr(tc, "rope_parameters", None) or {}
        return dict(
            hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
            num_heads=tc.num_attention_heads, num_kv_heads=getattr(tc, "num_key_value_heads", tc.num_attention_heads),
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            rms_norm_eps=tc.rms_norm_eps, rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 1e4))),
            max_position_embeddings=tc.max_position_embeddings, vocab_size=tc.vocab_size,
            target_layers=tc.num_hidden_layers,
        )

    def llama_config(self) -> LlamaConfig:
        """A one-layer `LlamaConfig` of this shape (for the decoder layer, its rotary embedding and cache)."""
        config = LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
        )
        config._attn_implementation = "sdpa"
        return config


@dataclass
class EagleConfig(LayerShape):
    """Shape of an EAGLE head (one decoder layer of the target's shape) and which target features it reads.

    The target layer's shape and vocabulary come from `LayerShape`; feature_layers: indices into the target's
    `hidden_states` tuple (0 = embeddings, target_layers = the final-normed top feature) that the head reads;
    one index is EAGLE-1, several are fused (EAGLE-3 direction); variant: a label for model cards;
    rank_temperature: the tree-ranking temperature fitted for this head on greedy runs over training prompts
    (`specdec_lab.train.eagle.fit_rank_temperature`; 1.0, EAGLE-2's own ranking, until fitted); layout:
    "course" (the course's head, see `EagleHead`) or "vllm" (the paper's head as vLLM loads it).
    """

    feature_layers: list[int] = field(default_factory=list)
    variant: str = "eagle1"
    rank_temperature: float = 1.0
    layout: str = "course"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"EAGLE head layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.layout == "vllm" and len(self.feature_layers) > 1:
            raise ValueError("the vllm layout is vLLM's EAGLE-1 head: it reads one feature (the top one)")

    @classmethod
    def from_target(cls, target: nn.Module, feature_layers: list[int] | None = None,
                    variant: str = "eagle1", layout: str = "course") -> EagleConfig:
        """The head config that fits `target` (feature_layers: None = the top feature only)."""
        layers = target.config.num_hidden_layers
        feature_layers = [layers] if feature_layers is None else [i % (layers + 1) for i in feature_layers]
        return cls(**LayerShape.of_target(target), feature_layers=feature_layers, variant=variant, layout=layout)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A (q, kv) boolean "may attend" matrix as the (1, 1, q, kv) additive mask the attention layer takes."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def causal_allowed(query_length: int, past_length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(q, past + q) booleans: every query sees the whole past and the queries up to itself."""
    return torch.ones(query_length, past_length + query_length, dtype=torch.bool, device=device).tril(past_length)


class EagleHead(nn.Module):
    """The EAGLE draft head: fc([feature ; embed(token)]) (2H -> H), one Llama decoder layer, an RMSNorm.

    The closing norm (a departure from the paper's head) puts predictions in the same normed space as the
    target feature they regress onto; a decoder layer alone adds to a residual stream whose scale (std ~25
    in the zoo target, measured) is far from the normed feature's (~1), and its first logits would be wild.

    Layout "vllm" is the paper's head exactly as vLLM runs it (`EagleLlamaForCausalLM` in
    vllm/model_executor/models/llama_eagle.py): fc without a bias, no RMSNorm before the layer's attention
    (its input is fc's output, already on the feature's scale) and no closing norm, so the head's raw output
    is both scored by lm_head and fed back as the next feature. Trained that way from the start, it needs
    neither; `specdec_lab.vllm` converts such a head into vLLM's checkpoint.

    It borrows the target's embedding and lm_head (frozen, never saved with the head): call `attach(target)`
    before use. `forward` returns predicted features; `logits` maps features to token scores.
    """

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        self.layer_config = config.llama_config()
        hidden = config.hidden_size
        fused = len(config.feature_layers)
        if fused < 1:
            raise ValueError("an EAGLE head needs at least one feature layer")
        # EAGLE-3 direction: several layers' features, fused into one by a linear map (identity for EAGLE-1).
        self.fuse = nn.Linear(fused * hidden, hidden, bias=False) if fused > 1 else None
        course = config.layout == "course"
        self.fc = nn.Linear(2 * hidden, hidden, bias=course)
        self.layer = LlamaDecoderLayer(self.layer_config, layer_idx=0)
        if not course:
            self.layer.input_layernorm = nn.Identity()
        self.rotary = LlamaRotaryEmbedding(self.layer_config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps) if course else nn.Identity()
        self._borrowed: tuple[nn.Module, nn.Module] | None = None  # (embedding, lm_head), not submodules

    def attach(self, target: nn.Module) -> EagleHead:
        """Borrow `target`'s embedding and lm_head and move the head to its device and dtype."""
        tc, hc = target.config, self.config
        if (tc.hidden_size, tc.vocab_size, tc.num_hidden_layers) != (hc.hidden_size, hc.vocab_size, hc.target_layers):
            raise ValueError(
                f"this EAGLE head was built for a target with hidden size {hc.hidden_size}, vocabulary "
                f"{hc.vocab_size} and {hc.target_layers} layers; the given target has {tc.hidden_size}, "
                f"{tc.vocab_size} and {tc.num_hidden_layers}"
            )
        self._borrowed = (target.get_input_embeddings(), target.get_output_embeddings())
        weight = self._borrowed[1].weight
        return self.to(device=weight.device, dtype=weight.dtype)

    def _target_parts(self) -> tuple[nn.Module, nn.Module]:
        if self._borrowed is None:
            raise RuntimeError("the EAGLE head is not attached to a target: call head.attach(target) first")
        return self._borrowed

    def fuse_features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The head's input feature from the target's per-layer hidden states (..., H)."""
        chosen = [hidden_states[i] for i in self.config.feature_layers]
        if self.fuse is None:
            return chosen[0]
        # Inner layers' residual streams are ~25x larger than the normed top feature: normalise each first.
        eps = self.config.rms_norm_eps
        return self.fuse(torch.cat([F.rms_norm(h, h.shape[-1:], eps=eps) for h in chosen], dim=-1))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        """Predicted next features (B, T, H).

        features: the input features (B, T, H), fused target features or the head's own predictions;
        tokens: (B, T) the token that follows each feature's position; position_ids: (B, T) positions;
        attention_mask: additive (1 or B, 1, T, past + T); cache: the head's KV cache (appended to), or None.
        """
        embed, _ = self._target_parts()
        x = self.fc(torch.cat([features, embed(tokens).to(features.dtype)], dim=-1))
        rope = self.rotary(x, position_ids)
        x = self.layer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                       use_cache=cache is not None, position_embeddings=rope)
        return self.norm(x)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Token scores of (predicted) features through the target's lm_head."""
        return self._target_parts()[1](features)

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for the head's one layer (always a growing one: the head's forwards build their
        masks over the cached length, and one layer costs little next to the target)."""
        return new_cache(self.layer_config, allow_static=False)

    def init_from_target_layer(self, target: nn.Module, index: int = -1) -> None:
        """Warm start for training: the decoder layer copies target layer `index`, the norm the final norm
        (the norms a "vllm" layout head lacks are left out)."""
        own = self.layer.state_dict()
        self.layer.load_state_dict({k: v for k, v in target.model.layers[index].state_dict().items() if k in own})
        if isinstance(self.norm, LlamaRMSNorm):
            self.norm.load_state_dict(target.model.norm.state_dict())

    def save(self, folder: str | Path) -> None:
        """Write `config.json` and fp16 `model.safetensors` into `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.save_config(folder)
        state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))

    def save_config(self, folder: str | Path) -> None:
        """Write only `config.json` into `folder` (after a setting such as `rank_temperature` was fitted)."""
        text = json.dumps({"model_type": "eagle_head", **asdict(self.config)}, indent=2) + "\n"
        (Path(folder) / "config.json").write_text(text)

    @classmethod
    def load(cls, folder: str | Path, target: nn.Module) -> EagleHead:
        """Read a head saved by `save` and attach it to `target` (weights upcast to the target's dtype)."""
        folder = Path(folder)
        if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
            raise FileNotFoundError(f"no EAGLE head in {folder} (expected config.json and model.safetensors)")
        data = json.loads((folder / "config.json").read_text())
        data.pop("model_type", None)
        head = cls(EagleConfig(**data))
        head.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
        return head.attach(target).eval()


@dataclass
class TreeNode:
    """One drafted token of an EAGLE-2 tree: its parent node (-1 = the last emitted token), depth (1 = a
    child of the root), cumulative log-probability of the path, and which head-cache entry was fed to
    expand it (-1 = not expanded)."""

    token: int
    parent: int
    depth: int
    score: float
    fed: int = -1


def is_path(parents: list[int]) -> bool:
    """Whether a tree, given as each node's parent index (-1 = the root), parents first, is a single chain."""
    return parents == list(range(-1, len(parents) - 1))


class EagleDrafter(Drafter):
    """Drafts with an EAGLE head, as a chain (EAGLE-1) or a dynamic tree (EAGLE-2).

    head: an `EagleHead` (attached to the target it is used with); mode: "chain" or "tree"; depth: tokens
    per chain, or the tree's maximum depth; top_k: children per expanded node and nodes expanded per depth
    (tree mode); total_tokens: tree nodes kept after the final rerank (the verification budget);
    rank_temperature: the tree ranks nodes by log-softmax(logits / rank_temperature); None = the head's
    fitted value (`head.config.rank_temperature`) in greedy runs, where it was fitted, and 1.0 when sampling,
    where a node is kept with its target probability, which q itself estimates. EAGLE-2 ranks by the head's
    own confidence (1.0), which works when that confidence tracks acceptance. A head that is right more often
    than its probabilities say (the zoo's) spends the budget on siblings where depth pays. A value below 1
    sharpens the ranking toward each node's top child. It changes which nodes are verified, never what is
    accepted, so greedy output and losslessness do not depend on it.

    min_confidence: chain mode only: None (always `depth` tokens) or a threshold in (0, 1): stop before a
    token whose largest head probability is below it (at least one token is drafted).
    verification: chain mode only: "token" (the default, `verify.verify_rejection`) or "block"
    (`verify.verify_block`, Sun et al. 2025) for sampling runs; greedy runs match argmaxes either way.
    children: how a tree is built when sampling (greedy runs always build EAGLE-2's tree): "sampled" (the
    default) draws each node's children from the head's processed q without replacement into a shape fixed
    in advance (`specdec_lab.tree.sampled_tree_shape` with `total_tokens` nodes, `depth` levels, at most
    `top_k` children per node, and `alpha`, the acceptance per tried child the shape assumes); "top" keeps
    EAGLE-2's construction (the likeliest tokens, verified as point masses).

    Losslessness when sampling. Chain mode draws each token from the head's processed distribution q
    (temperature / top-k / top-p applied as to the target) and hands q to the chain rule of Leviathan et al.

    Sampled trees (Jeon et al. 2024's recursive rejection sampling; SpecTr and SpecInfer for multiple drafts).
    The verifier (`verify.verify_tree_rejection`) tries a node's children in order and is exact as long as
    the j-th child, given everything drawn before it, is distributed as the q it is verified against. Three
    rules make that true: (1) how many children a node gets is fixed before they are drawn (here: by its
    position in the shape, a function of its ancestors only); (2) the children are drawn in order, each from
    q with the earlier siblings removed and renormalised, and that conditional q is what the node carries;
    (3) no drawn child is ever dropped because of its own token or probability (it would then no longer be
    distributed as that q: a kept child would be biased toward whatever the dropping rule favours). EAGLE-2's
    "draw, then keep the likeliest" breaks rule 3, which is why sampled trees have a shape, not a rerank.
    Unlike point-mass children, which are accepted with probability p(x) only, a sampled child is accepted
    with probability min(1, p(x) / q(x)): at temperature 1 the first child alone is accepted as often as a
    chain token, and every further sibling is a second chance.

    Top-k trees ("top", and every greedy tree) keep EAGLE-2's construction on the processed q: top-k
    children, distinct siblings, reranking by cumulative log q. That tree is a function of the context alone
    and is fixed before the verifier draws any random number, so, given the context and its earlier
    siblings, each node was "drawn" from a point mass at its own token. The shared multi-candidate rule is
    exact for that case (probs=None): it accepts a child x with probability p(x) under the current residual p
    and, on rejection, removes x's mass from p.
    """

    needs_hidden_states = True

    def __init__(self, head: EagleHead, mode: str = "chain", depth: int = 5, top_k: int = 8,
                 total_tokens: int = 32, rank_temperature: float | None = None, children: str = "sampled",
                 alpha: float = 0.6, min_confidence: float | None = None, verification: str = "token"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if children not in CHILDREN:
            raise ValueError(f"children must be one of {CHILDREN}, got {children!r}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha (the acceptance a sampled tree's shape assumes) must lie in (0, 1), got {alpha!r}")
        for name, value in (("depth", depth), ("top_k", top_k), ("total_tokens", total_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if rank_temperature is not None and not rank_temperature > 0:
            raise ValueError(f"rank_temperature must be positive, got {rank_temperature!r}")
        self.head = head
        self.mode = mode
        self.depth = depth
        self.top_k = top_k
        self.total_tokens = total_tokens
        self.rank_temperature = rank_temperature
        check_confidence(min_confidence)
        if min_confidence is not None and mode != "chain":
            raise ValueError("min_confidence (adaptive draft length) applies to chain mode only")
        self.verification = check_verification(verification)
        if verification != "token" and mode != "chain":
            raise ValueError("verification='block' verifies a chain: it applies to mode='chain' only (trees are "
                             "verified by the multi-candidate rule)")
        self.children = children
        self.alpha = alpha
        self.min_confidence = min_confidence
        self._shapes: dict[int, tuple[list[tuple[int, ...]], dict[tuple[int, ...], int]]] = {}
        self.cache: DynamicCache | None = None
        self.committed = 0  # head positions fed with the target's true features
        self.last_feature: torch.Tensor | None = None  # the head's prediction after the last true position
        self.last_logits: torch.Tensor | None = None

    def start(self, state: DecodeState) -> None:
        if self.head._borrowed is None or self.head._borrowed[1] is not state.target.get_output_embeddings():
            self.head.attach(state.target)
        self.cache = self.head.new_cache()
        self.committed = 0
        self._absorb(state)

    def commit(self, state: DecodeState, accepted: int) -> None:
        # Drop the speculative entries of the last draft; re-feed the accepted positions with true features.
        truncate(self.cache, self.committed)
        self._absorb(state)

    def _absorb(self, state: DecodeState) -> None:
        """Feed the head every verified position it has not seen: feature f_t paired with token x_{t+1}."""
        features = self.head.fuse_features(state.hidden_states)
        new = len(state.tokens) - 1 - self.committed
        if features.shape[0] != new:
            raise RuntimeError(f"EAGLE expected the target features of {new} new positions, got {features.shape[0]}")
        tokens = torch.tensor(state.tokens[self.committed + 1 :], device=state.device)
        positions = torch.arange(self.committed, self.committed + new, device=state.device)
        mask = additive_mask(causal_allowed(new, self.committed, state.device), features.dtype)
        out = self.head(features[None], tokens[None], positions[None], mask, self.cache)[0]
        self.committed += new
        self.last_feature = out[-1]
        self.last_logits = self.head.logits(out[-1]).float()

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        if self.mode == "chain":
            return self._propose_chain(state, min(self.depth, max_tokens))
        if self.top_k == 1 and (state.sampling.greedy or self.children == "sampled"):
            # A one-branch tree is a chain (each node's only child is its top token, or one draw from q), so it
            # is drafted and verified as one. Top-k children when sampling stay point masses: no shortcut.
            return self._propose_chain(state, min(self.depth, self.total_tokens, max_tokens))
        if not state.sampling.greedy and self.children == "sampled":
            return self._propose_sampled_tree(state, min(self.depth, max_tokens))
        return self._propose_tree(state, min(self.depth, max_tokens))

    def _step(self, features: torch.Tensor, tokens: torch.Tensor, depth: int, allowed: torch.Tensor) -> torch.Tensor:
        """One batched head forward of speculative nodes at draft depth `depth` (1 = right after the verified
        prefix); appends their entries to the head cache and returns their predicted features (n, H)."""
        positions = torch.full((1, len(tokens)), self.committed + depth - 1, device=tokens.device)
        mask = additive_mask(allowed, features.dtype)
        return self.head(features[None], tokens[None], positions, mask, self.cache)[0]

    def _propose_chain(self, state: DecodeState, k: int) -> Draft:
        feature, logits = self.last_feature, self.last_logits
        tokens, probs = [], []
        for i in range(k):
            if i and self.min_confidence is not None and confidence(logits, state.sampling) < self.min_confidence:
                break  # the head is unsure of this token: verify what we have (decided from q alone)
            token, q = draw(logits, state.sampling, state.generator)
            if q is not None:
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:  # the last drafted token is never fed: nothing would read its prediction
                allowed = causal_allowed(1, self.committed + i, state.device)
                feature = self._step(feature[None], token.reshape(1), i + 1, allowed)[0]
                logits = self.head.logits(feature).float()
        return Draft(torch.stack(tokens), torch.stack(probs) if probs else None, verification=self.verification)

    def ranking_temperature(self, sampling: SamplingConfig) -> float:
        """The temperature the tree ranks by under `sampling` (see `rank_temperature` in the class docstring)."""
        if self.rank_temperature is not None:
            return self.rank_temperature
        return self.head.config.rank_temperature if sampling.greedy else 1.0

    def _log_q(self, logits: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Log draft probabilities for ranking tree nodes, under the run's sampling settings (-inf where they
        remove a token), then sharpened by `rank_temperature` over the same tokens."""
        if state.sampling.greedy:
            log_q = torch.log_softmax(logits, -1)
        else:
            log_q = process_logits(logits, state.sampling).log()
        temperature = self.ranking_temperature(state.sampling)
        if temperature != 1.0:  # sharpen after top-k / top-p, so the tokens they keep stay the same
            log_q = torch.log_softmax(log_q / temperature, -1)
        return log_q

    def _children(self, parent: int, parent_score: float, log_q: torch.Tensor, depth: int) -> list[TreeNode]:
        """The `top_k` most likely children of a node (those the sampling settings allow)."""
        scores, tokens = log_q.topk(min(self.top_k, log_q.shape[-1]))
        return [TreeNode(int(t), parent, depth, parent_score + float(s))
                for s, t in zip(scores.tolist(), tokens.tolist(), strict=True) if s > float("-inf")]

    def _propose_tree(self, state: DecodeState, depth: int) -> Draft:
        """EAGLE-2: grow by expanding the best `top_k` nodes of each depth, then keep the best `total_tokens`."""
        nodes = self._children(-1, 0.0, self._log_q(self.last_logits, state), 1)
        fed_features: list[torch.Tensor] = []  # the head's output of every fed (expanded) node, in feeding order
        for d in range(1, depth):
            layer = sorted((i for i, n in enumerate(nodes) if n.depth == d), key=lambda i: -nodes[i].score)
            expand = layer[: self.top_k]
            if not expand:
                break
            out = self._expand(nodes, expand, fed_features, d, state.device)
            log_q = self._log_q(self.head.logits(out).float(), state)
            for row, i in enumerate(expand):
                nodes[i].fed = len(fed_features)
                fed_features.append(out[row])
                nodes.extend(self._children(i, nodes[i].score, log_q[row], d + 1))
        return self._best_subtree(nodes, state.device, state.sampling.greedy)

    def _expand(self, nodes: list[TreeNode], expand: list[int], fed_features: list[torch.Tensor], depth: int,
                device: torch.device) -> torch.Tensor:
        """One head forward over the nodes `expand` (all at `depth`): each sees the verified prefix, the
        head-cache entries of its own ancestors and itself. Returns their predicted features (len(expand), H)."""
        past = self.committed + len(fed_features)
        allowed = torch.zeros(len(expand), past + len(expand), dtype=torch.bool, device=device)
        allowed[:, : self.committed] = True
        features, tokens = [], []
        for row, i in enumerate(expand):
            allowed[row, past + row] = True
            parent = nodes[i].parent
            features.append(self.last_feature if parent < 0 else fed_features[nodes[parent].fed])
            while parent >= 0:  # every ancestor was expanded, so it has a head-cache entry
                allowed[row, self.committed + nodes[parent].fed] = True
                parent = nodes[parent].parent
            tokens.append(nodes[i].token)
        return self._step(torch.stack(features), torch.tensor(tokens, device=device), depth, allowed)

    def _best_subtree(self, nodes: list[TreeNode], device: torch.device, greedy: bool) -> Draft:
        """Keep the `total_tokens` nodes of highest cumulative log-probability, parents first.

        greedy: whether the run is greedy; then a kept set that is a single path is handed over as a chain
        (greedy matching is the same rule for both). When sampling, top-k nodes stay a tree, whose rule treats
        them as point masses.

        A child scores at most its parent (log-probabilities are <= 0) and ties are broken by depth, so the
        kept set always contains every kept node's parent.
        """
        ranked = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth, i))
        kept = sorted(ranked[: self.total_tokens], key=lambda i: (nodes[i].depth, i))
        index = {node: slot for slot, node in enumerate(kept)}
        parents = [index[nodes[i].parent] if nodes[i].parent >= 0 else -1 for i in kept]
        tokens = torch.tensor([nodes[i].token for i in kept], dtype=torch.long, device=device)
        if greedy and is_path(parents):
            return Draft(tokens, None)  # a one-branch tree is a chain: verified as one, without a tree mask
        # Every candidate is a deterministic function of the context (no random draw), so verification
        # treats each as drawn from a point mass: probs=None (see the class docstring on losslessness).
        return Draft(tokens, None, parents=torch.tensor(parents, dtype=torch.long, device=device))

    # --- Sampled trees (temperature > 0) -----------------------------------------------------------------------

    def sampled_shape(self, depth: int) -> tuple[list[tuple[int, ...]], dict[tuple[int, ...], int]]:
        """The sampled tree's shape for `depth` levels (choice-tuples, parents first) and, per choice-tuple,
        how many children it gets (its children are ranks 0 .. n - 1, as `sparse_tree` keeps ranks in order)."""
        if depth not in self._shapes:
            shape = sampled_tree_shape(self.total_tokens, depth, self.top_k, self.alpha)
            counts: dict[tuple[int, ...], int] = {}
            for choice in shape:
                counts[choice[:-1]] = max(counts.get(choice[:-1], 0), choice[-1] + 1)
            self._shapes[depth] = (shape, counts)
        return self._shapes[depth]

    def draw_children(self, q: torch.Tensor, count: int,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` children of one node, drawn from its processed q without replacement, each with the q it
        was drawn from given its earlier siblings (fewer when q allows fewer tokens)."""
        return sample_without_replacement(q, count, generator)

    def _propose_sampled_tree(self, state: DecodeState, depth: int) -> Draft:
        """A sampled tree: level by level, every node with children in the shape gets them drawn from its q.

        Each level is one batched head forward over the nodes that have children (as in EAGLE-2); nodes are
        listed parents first and siblings in the order they were drawn, which is the order the verifier
        tries them in. Nothing drawn is ever dropped (see the class docstring on losslessness).
        """
        shape, counts = self.sampled_shape(depth)
        nodes: list[TreeNode] = []
        choices: list[tuple[int, ...]] = []
        probs: list[torch.Tensor] = []

        def add_children(parent: int, q: torch.Tensor) -> None:
            choice = choices[parent] if parent >= 0 else ()
            tokens, conditionals = self.draw_children(q, counts.get(choice, 0), state.generator)
            for rank, (token, conditional) in enumerate(zip(tokens.tolist(), conditionals, strict=True)):
                nodes.append(TreeNode(token, parent, len(choice) + 1, 0.0))
                choices.append(choice + (rank,))
                probs.append(conditional)

        add_children(-1, process_logits(self.last_logits, state.sampling))
        fed_features: list[torch.Tensor] = []
        for d in range(1, depth):
            expand = [i for i, node in enumerate(nodes) if node.depth == d and counts.get(choices[i], 0)]
            if not expand:
                break
            out = self._expand(nodes, expand, fed_features, d, state.device)
            q = process_logits(self.head.logits(out).float(), state.sampling)
            for row, i in enumerate(expand):
                nodes[i].fed = len(fed_features)
                fed_features.append(out[row])
                add_children(i, q[row])
        tokens = torch.tensor([node.token for node in nodes], dtype=torch.long, device=state.device)
        parents = [node.parent for node in nodes]
        if is_path(parents):
            # One child per node: recursive rejection over one candidate is the chain rule, so verify it as one.
            return Draft(tokens, torch.stack(probs))
        return Draft(tokens, torch.stack(probs), parents=torch.tensor(parents, dtype=torch.long, device=state.device))
