"""Training code for the shipped zoo: corpus, tokenizer, target pre-training, draft distillation, heads."""
