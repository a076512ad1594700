"""Generation (stations 18-20). `engine`: the Engine, which owns the model, tokenizer, dtype and
cache choice and runs the loops (sampling with and without a KV cache, beam search, streams);
`settings`: one GenerationSettings record; `generate`: one-call entry points; `options`: the
SamplingOptions record (torch-free); `sampling`: the next-token choice; `beam`: beam search's bookkeeping; `decoding`: the decoding copy (the weights
cast and laid out for the compiled step); `text_rows`: the text side of a growing sample."""
