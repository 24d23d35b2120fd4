"""DeepSpeed ZeRO on exatrain: config (from `[engine]`), setup (launch path), engine (the trainer's step),
checkpoints (in the run layout), universal (resharding)."""
