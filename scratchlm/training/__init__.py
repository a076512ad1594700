"""Training (stations 16-17). `train` tells a run top to bottom; `setup` decides everything once
(dtype, run folder, tokenizer, block size, data, vocabulary, model config) into a frozen RunSetup;
`parts` builds the model and what a step works on; `state` holds the counters and clocks;
`resume` saves and restores a run; `ending` is how a run stops and what it returns. Beside them:
the config (`train_config`), the batches of each process (`batches`; a fine-tuning stage's
conversations, `sft_batches`), precision (`precision`),
Muon and AdamW (`optim`), evaluation, several processes (`distributed`), checkpoints and their
config.json (scratchlm.checkpoint), the run's folder (`run_folder`; the rules for output folders and
their lock are scratchlm.outdir and scratchlm.runlock),
where `--init_from` starts (`sources`), the log and its plot (`progress`, `plot`), and scoring a
text (`scoring`)."""
