"""Byte-level BPE tokenizer for the zoo, trained with `tokenizers` and saved as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Learn a byte-level BPE vocabulary on `texts` and save it so `AutoTokenizer.from_pretrained` loads it.

    texts: training documents; vocab_size: number of tokens including the end-of-text token;
    out_dir: folder to write (`tokenizer.json` and its config).
    """
    bpe = Tokenizer(models.BPE())
    # Byte-level pre-tokenisation without a prefix space: every byte string round-trips exactly.
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer
