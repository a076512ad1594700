"""The command line: `main` (the `scratchlm` command and its subcommands), `flags` (argument types shared by them) and `look_inside` (inspect, walkthrough, attention, tokenize, doctor)."""
