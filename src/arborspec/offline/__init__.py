"""Offline tools: they run for minutes, write files, and never run inside a generation step.

`calibrate` (Sequoia's acceptance vector and costs), `c2t` (training the C2T
classifier), `distill` (training a draft model) and `draft_quality` (teacher-forced
draft statistics). Nothing in the engine, the drafters or the builders imports them.
"""
