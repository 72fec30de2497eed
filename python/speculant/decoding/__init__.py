"""The decoding API: the speculative decoder and plain generation (decoder), its sampling settings, token trees,
beams, drafters, drafts with another tokenizer, CUDA graphs and the per-iteration trace."""
