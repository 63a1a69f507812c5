"""The benchmark: prompt sets (`prompts`), the sweep runner (`run`), its figures (`metrics`) and the
report (`report`)."""
