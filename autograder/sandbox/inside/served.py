"""A model the trusted side serves: it looks like a Hugging Face causal LM, but its weights stay outside.

Some checks ask how an answer was computed, not only what it is: a speculative loop must spend one target
forward per step, a tree must be scored in one forward, Jacobi decoding must take as many iterations as it
takes. A counter inside the sandbox could be reset by the code it counts, so the model itself is served: every
forward travels to the trusted side as a frame (tokens, mask, positions, how much of the cache to keep), runs
there on weights the sandbox never sees, and is counted where it is answered. The student's code holds a
`ServedModel`: it calls it like the Hugging Face model it stands for, with or without a `DynamicCache`.

The KV cache itself lives on the trusted side. The student's `DynamicCache` holds zero placeholders of the
right shapes, so that its length, `crop` and `get_seq_length` behave as usual; before each forward the length
it reports tells the trusted side how much of the real cache to keep.
"""

from __future__ import annotations

import torch
from transformers import CONFIG_MAPPING, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast


class ServedModel(torch.nn.Module):
    """Stands for the served model `name` (its config is public, its weights are not); `channel.request`
    sends one forward request and returns the trusted side's reply."""

    def __init__(self, name: str, config: dict, channel):
        super().__init__()
        config = dict(config)
        self.config = CONFIG_MAPPING[config.pop("model_type")].from_dict(config)
        self.name, self.channel = name, channel
        # One frozen parameter, so that `next(model.parameters())`, `.device` and `.dtype` work as usual.
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, output_hidden_states=False, cache=None, **ignored) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = DynamicCache(config=self.config)
        ids = torch.as_tensor(input_ids).long()
        if ids.dim() == 1:
            ids = ids[None]
        past = cache.get_seq_length() if cache is not None else 0
        reply = self.channel.request({"forward": {
            "model": self.name, "cache": None if cache is None else id(cache), "past": past,
            "input_ids": ids.tolist(),
            "attention_mask": None if attention_mask is None else torch.as_tensor(attention_mask).float().tolist(),
            "position_ids": None if position_ids is None else torch.as_tensor(position_ids).long().tolist(),
            "hidden_states": bool(output_hidden_states)}})
        if "error" in reply:
            raise RuntimeError(f"the served model refused this forward: {reply['error']}")
        if cache is not None:
            self.extend_placeholders(cache, ids.shape[1])
        hidden = tuple(torch.tensor(h) for h in reply["hidden_states"]) if output_hidden_states else None
        return CausalLMOutputWithPast(logits=torch.tensor(reply["logits"]), past_key_values=cache,
                                      hidden_states=hidden)

    def generate(self, *args, **kwargs):
        raise NotImplementedError("a served model has no generate(): call it one forward at a time")

    def extend_placeholders(self, cache: DynamicCache, new_tokens: int) -> None:
        """Grow the student's cache by `new_tokens` zero entries in every layer (its length is what counts)."""
        heads = getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads
        head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        zeros = torch.zeros(1, heads, new_tokens, head_dim)
        for layer in range(self.config.num_hidden_layers):
            cache.update(zeros, zeros, layer)
