"""vLLM on the zoo pair: its counters read into the course's tau and acceptance, the zoo's Medusa heads in vLLM's
layout, and (where vLLM's environment is made) its tokeniser and its greedy draft-model decoding against ours.

The tests that run vLLM need its environment (`make production`, which CI runs); without it they skip and say
so. They load one engine (about 45 s on 2 quiet cores; 20 minutes were measured on a machine running ten
other jobs) and run vLLM's own Medusa blocks once.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import make_llama
from safetensors.torch import load_file, save_file

from specdec_lab import engines, generate, load_pair, vllm, vllm_worker
from specdec_lab.drafters.medusa import MedusaHeads
from specdec_lab.models import zoo_path

needs_vllm = pytest.mark.skipif(vllm.missing() is not None, reason=str(vllm.missing()))


def fake_llm(drafts: int, draft_tokens: int, accepted: int, per_position: list[int]):
    """An object whose get_metrics() answers as vLLM's LLM does (Counter and Vector metrics by name)."""
    metrics = [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=drafts),
               SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=draft_tokens),
               SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=accepted),
               SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=per_position),
               SimpleNamespace(name="vllm:prompt_tokens", value=999)]
    return SimpleNamespace(get_metrics=lambda: metrics)


def test_the_worker_reads_one_requests_counters_from_vllms_cumulative_metrics():
    before = vllm_worker.spec_counters(fake_llm(3, 12, 7, [3, 2, 2]))
    after = vllm_worker.spec_counters(fake_llm(13, 52, 27, [9, 8, 6, 4]))
    assert vllm_worker.spec_counters(SimpleNamespace(get_metrics=list)) == {
        "drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": []}
    assert vllm_worker.difference(after, before) == {"drafts": 10, "draft_tokens": 40, "accepted": 20,
                                                     "accepted_per_position": [6, 6, 4, 4]}


def test_counters_become_the_courses_tau_acceptance_and_survival():
    # One prompt: the prefill's token, then 10 steps of k = 4 drafts that keep 20 in all, each step adding one
    # token of the target's own: 1 + 20 + 10 = 31 tokens from 11 target forwards.
    done = vllm.Generation([list(range(31))], 0.5, drafts=10, draft_tokens=40, accepted=20,
                           accepted_per_position=[8, 6, 4, 2])
    stats = done.stats(fixed_length=4)
    assert done.tau == pytest.approx(31 / 11) == stats.mean_accepted_tokens
    assert stats.target_forwards == 11  # the prefill and the 10 verification steps
    assert done.acceptance == pytest.approx(0.5) == stats.acceptance_rate
    assert stats.per_position_acceptance == pytest.approx([0.8, 0.6, 0.4, 0.2])
    assert stats.conditional_acceptance == pytest.approx([0.8, 6 / 8, 4 / 6, 2 / 4])
    plain = vllm.Generation([[1, 2, 3], [4, 5, 6]], 0.1)
    assert plain.tau == 1.0 and plain.acceptance == 0.0 and plain.stats().per_position_acceptance == []
    assert engines.course_tau(64, 41) == pytest.approx(64 / 23)
    # vLLM drafts k at a sequence's last step too, and counts the drafts kept past max_tokens (measured: 10
    # prompts x 32 tokens, 122 drafts, 208 accepted, where our engine took the same 122 steps): the target still
    # ran once per draft and once per prefill, which bounds the forwards from below.
    overshoot = vllm.Generation([list(range(32))], 0.5, drafts=12, draft_tokens=48, accepted=23)
    assert overshoot.tau == pytest.approx(32 / 13) == overshoot.stats(fixed_length=4).mean_accepted_tokens
    # An n-gram miss is a step without a draft: there new_tokens - accepted is the larger, exact bound.
    assert vllm.Generation([list(range(32))], 0.5, drafts=5, draft_tokens=20, accepted=12).tau == pytest.approx(32 / 20)


def tiny_zoo(tmp_path, heads: int = 3):
    """A zoo folder with a small random target (untied lm_head) and random Medusa heads."""
    target = make_llama(vocab_size=96, hidden_size=32, seed=3)
    target.save_pretrained(tmp_path / "target")
    medusa = MedusaHeads(32, heads)
    generator = torch.Generator().manual_seed(5)
    for block in medusa.blocks:
        block.weight.data = torch.randn(block.weight.shape, generator=generator) * 0.3
        block.bias.data = torch.randn(block.bias.shape, generator=generator) * 0.3
    medusa.save(tmp_path / "medusa")
    return target, MedusaHeads.load(tmp_path / "medusa")


def test_converted_medusa_heads_give_our_logits_the_way_vllm_computes_them(tmp_path):
    target, heads = tiny_zoo(tmp_path / "zoo")
    done = vllm.convert_heads(tmp_path / "zoo", tmp_path / "out")
    config = json.loads((done["medusa"] / "config.json").read_text())
    state = {k: v.float() for k, v in load_file(str(done["medusa"] / "model.safetensors")).items()}
    # vLLM's Medusa: blocks.{head}.layers.{layer}.weight/bias (ResidualBlock) and lm_heads.{head}.weight.
    assert sorted(state) == sorted([f"blocks.{k}.layers.0.{p}" for k in range(3) for p in ("weight", "bias")]
                                   + [f"lm_heads.{k}.weight" for k in range(3)])
    assert state["blocks.2.layers.0.weight"].shape == (32, 32) and state["lm_heads.0.weight"].shape == (96, 32)
    assert config["model_type"] == "medusa" and config["num_heads"] == 3 and config["medusa_fc_bias"] is True
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    ours = heads.logits(hidden, target.lm_head)
    theirs = vllm.medusa_logits_as_vllm(state, config, hidden)
    assert theirs.shape == ours.shape == (5, 3, 96)
    torch.testing.assert_close(theirs, ours.detach(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours[:, 0], ours[:, 1]), "the heads differ, so a swapped head would be caught"
    assert vllm.convert_heads(tmp_path / "zoo", tmp_path / "out")["medusa"] == done["medusa"]  # reused


def test_the_zoos_course_heads_are_refused_with_the_layout_differences_that_hold_for_them():
    """The reasons name properties of the zoo's course heads (an fc bias, a closing norm, the target's
    final-normed feature among EAGLE-3's inputs); each is checked here, so a head retrained in vLLM's layout
    under the same name fails this test and the refusal is revisited."""
    zoo = zoo_path()
    for name, reason in (("eagle", "no choice of vLLM's weights"), ("eagle3", "not a function of the two")):
        state = load_file(str(zoo / name / "model.safetensors"))
        assert "fc.bias" in state and "norm.weight" in state and "layer.input_layernorm.weight" in state
        config = json.loads((zoo / name / "config.json").read_text())
        with pytest.raises(ValueError, match=reason):
            vllm.eagle_checkpoint(state, config, json.loads((zoo / "target" / "config.json").read_text()))
    assert vllm.convert_heads(zoo, None)["eagle3"] == vllm.EAGLE_MISMATCH["eagle3"]
    with pytest.raises(vllm.VllmUnavailable, match="cannot run in vLLM"):
        vllm.speculative_config("eagle3", zoo=zoo)
    eagle3 = json.loads((zoo / "eagle3" / "config.json").read_text())
    assert eagle3["target_layers"] in eagle3["feature_layers"]  # the final-normed feature vLLM does not expose


def vllm_layout_head(zoo, target):
    """A seeded random EAGLE-1 head in vLLM's layout, saved where the zoo keeps it."""
    from specdec_lab.drafters.eagle import EagleConfig, EagleHead

    torch.manual_seed(11)
    head = EagleHead(EagleConfig.from_target(target, None, "eagle1-vllm", "vllm")).attach(target)
    with torch.no_grad():
        head.layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)  # not all ones: a dropped norm shows
    head.save(zoo / vllm.VLLM_EAGLE)
    return EagleHead.load(zoo / vllm.VLLM_EAGLE, target)


def test_a_head_in_vllms_layout_converts_and_predicts_our_features_the_way_vllm_computes_them(tmp_path):
    from specdec_lab.drafters.eagle import additive_mask, causal_allowed

    target, _ = tiny_zoo(tmp_path / "zoo")
    head = vllm_layout_head(tmp_path / "zoo", target)
    assert not hasattr(head.fc, "bias") or head.fc.bias is None
    folder = vllm.convert_heads(tmp_path / "zoo", tmp_path / "out")["eagle"]
    config = json.loads((folder / "config.json").read_text())
    state = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    # vLLM's EagleLlamaForCausalLM: fc (no bias) and one Llama layer without its input norm; it shares the
    # target's embedding and lm_head, so neither is written.
    layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm"]
    assert sorted(state) == sorted(["fc.weight"] + [f"layers.0.{name}.weight" for name in layer])
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == 32 and config["vocab_size"] == 96
    generator = torch.Generator().manual_seed(2)
    features, tokens = torch.randn(6, 32, generator=generator), torch.randint(0, 96, (6,), generator=generator)
    positions = torch.arange(3, 9)
    with torch.no_grad():
        ours = head(features[None], tokens[None], positions[None], additive_mask(causal_allowed(6, 0), torch.float32))
        theirs = vllm.eagle_features_as_vllm(state, config, features, target.get_input_embeddings()(tokens),
                                             positions)
    torch.testing.assert_close(theirs, ours[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(theirs @ target.lm_head.weight.T, head.logits(ours)[0], rtol=1e-4, atol=1e-4)


def test_the_environment_script_installs_the_pins_this_module_expects():
    script = (Path(vllm.__file__).parents[1] / "scripts" / "vllm_env.sh").read_text()
    pins = re.search(r"^PINS=\((.*)\)$", script, re.M).group(1).split()
    assert tuple(pins) == vllm.PINS
    assert "uninstall --quiet -y torchvision torchaudio torchcodec" in script and "exit 0" in script


def test_speculative_configs_and_missing_environment(monkeypatch, tmp_path):
    zoo = zoo_path()
    assert vllm.speculative_config("plain") is None
    assert vllm.speculative_config("draft", 3, zoo) == {"method": "draft_model", "model": str(zoo / "draft"),
                                                       "num_speculative_tokens": 3}
    assert vllm.speculative_config("ngram", 8)["prompt_lookup_max"] == 4
    with pytest.raises(ValueError, match="unknown vLLM method"):
        vllm.speculative_config("lookahead")
    monkeypatch.setenv("SPECDEC_VLLM_VENV", str(tmp_path))
    assert "make production" in vllm.missing()
    with pytest.raises(vllm.VllmUnavailable, match="make production"):
        vllm.VllmEngine(zoo / "target", zoo / "tokenizer")


# ------------------------------------------------------------------------------------------ with vLLM


VLLM_MEDUSA = """
import sys, types, torch
from safetensors.torch import load_file, save_file
from vllm.model_executor.models.medusa import ResidualBlock
folder, hidden_file, out_file = sys.argv[1:]
state = load_file(folder + "/model.safetensors")
hidden = load_file(hidden_file)["hidden"]
config = types.SimpleNamespace(medusa_fc_bias=True)
logits = []
for k in range(len([n for n in state if n.startswith("lm_heads.")])):
    block = ResidualBlock(config, hidden.shape[-1], 1)
    block.load_state_dict({n.removeprefix(f"blocks.{k}."): v.float() for n, v in state.items()
                           if n.startswith(f"blocks.{k}.")}, strict=True)
    logits.append(block(hidden) @ state[f"lm_heads.{k}.weight"].float().T)
save_file({"logits": torch.stack(logits, dim=-2).detach().contiguous()}, out_file)
"""


@needs_vllm
def test_vllms_own_medusa_blocks_load_the_converted_zoo_heads_and_give_our_logits(tmp_path):
    zoo = load_pair()
    heads = MedusaHeads.load(zoo_path() / "medusa")
    hidden = torch.randn(4, zoo.target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    save_file({"hidden": hidden}, str(tmp_path / "hidden.safetensors"))
    folder = vllm.convert_heads()["medusa"]
    subprocess.run([str(vllm.python()), "-c", VLLM_MEDUSA, str(folder), str(tmp_path / "hidden.safetensors"),
                    str(tmp_path / "out.safetensors")], check=True, timeout=300)
    theirs = load_file(str(tmp_path / "out.safetensors"))["logits"]
    torch.testing.assert_close(theirs, heads.logits(hidden, zoo.target.lm_head).detach(), rtol=1e-4, atol=1e-4)


def heldout_texts(count: int, chars: int) -> list[str]:
    """Slices of the validation split's source files: code none of the models trained on."""
    from specdec_lab.train.corpus import load_corpus

    corpus = load_corpus()
    return [corpus.read(path)[:chars] for path in corpus.val_files[:count]]


@needs_vllm
def test_vllm_tokenises_as_we_do_and_its_greedy_draft_model_decoding_is_ours():
    """One engine (the zoo target with the zoo draft, k = 4): the tokenisation check on held-out code; greedy
    output on 10 held-out prompts x 32 tokens against our plain greedy decoding (fp32 both; a near-tie may flip
    one prompt), with drafts accepted; then a sampled batch of two, seeded, which must differ from greedy."""
    from specdec_lab.bench import corpus_prompts

    zoo = load_pair()
    prompts = [p.ids for p in corpus_prompts("heldout", zoo.tokenizer, 10, 200)]
    with vllm.zoo_engine("draft", k=4, threads=1) as engine:  # 1 thread: no OpenMP spin-waits on a busy CI
        texts = heldout_texts(20, 2000)
        theirs = dict(zip(texts, engine.tokenize(texts), strict=True))
        assert engines.tokenisation_differences(theirs.__getitem__, zoo.tokenizer, texts) == []
        greedy = engine.generate(prompts, 32)
        sampled = engine.generate(prompts[:2], 32, temperature=1.0, seed=7)
    ours = [generate(zoo.target, ids, max_new_tokens=32).tokens for ids in prompts]
    same = sum(a == b for a, b in zip(ours, greedy.outputs, strict=True))
    assert same >= 9, f"vLLM's greedy draft-model output equals ours on {same} of 10 prompts"
    assert greedy.new_tokens == 320 and 0 < greedy.accepted <= greedy.draft_tokens and greedy.tau > 1.2
    assert len(greedy.accepted_per_position) == 4 and greedy.accepted_per_position[0] >= greedy.accepted_per_position[3]
    assert sampled.outputs != greedy.outputs[:2] and all(len(o) == 32 for o in sampled.outputs)


METRICS_PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="zoo"} 12.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="zoo"} 48.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="zoo"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="zoo",position="1"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="zoo",position="0"} 11.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="zoo",position="3"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="zoo",position="2"} 7.0
vllm:prompt_tokens_total{engine="0",model_name="zoo"} 999.0
"""


def test_the_servers_metrics_page_becomes_the_courses_counters():
    from specdec_lab.vllm_server import parse_spec_metrics

    counts = parse_spec_metrics(METRICS_PAGE)
    assert counts == {"drafts": 12, "draft_tokens": 48, "accepted": 30, "accepted_per_position": [11, 8, 7, 4]}
    assert parse_spec_metrics("# nothing speculative\nvllm:prompt_tokens_total 5.0\n") == \
        {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": []}


# `vllm serve` itself (the openai client's round trip, its /metrics, the port freed) is tested where the course
# uses it: lesson 7's headless run (tests/test_lessons.py, check_served_round_trip), one server start for both.
