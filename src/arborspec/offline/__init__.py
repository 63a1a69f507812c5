"""Offline tools: they run for minutes, write files, and never run inside a generation step.

`calibrate` (Sequoia's acceptance vector and costs), `c2t` (training the C2T
classifier), `distill` (training a draft model), `draft_quality` (teacher-forced
draft statistics), and for the draft head `head_data` (the target's answers with its
features), `train_head` and `head_quality`. What the training tools share has one
module each: `corpus` (the training prompts), `generation` and `batching` (batched
generation, length-bucketed batches), `shards` (resumable data folders) and `training`
(schedule, checkpoints, resume). Nothing in the engine, the drafters or the builders
imports them.
"""
