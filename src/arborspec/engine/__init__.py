"""The engine: what runs inside every generation step.

`tree` (the one `TokenTree`), `sampling` (temperature / top-k / top-p), `verifiers`
(accept or reject the tree's tokens), `adapter` (target forwards and KV compaction on
an unmodified Hugging Face model), `decode` (the step loop) and `stats` (what a step and
a generation report). Nothing here imports the
drafters, the builders, the offline tools or the benchmark.
"""
