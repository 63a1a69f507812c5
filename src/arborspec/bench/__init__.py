"""The benchmark: prompt sets (`prompts`), the sweep runner (`run`), its figures (`metrics`) and the
report (`report`); the results file both benchmarks write and resume (`results`); the concurrency
benchmark (`batch_config`, `batch_clients`, `batch_runner`, `batch_stats`, `batch_report`)."""
