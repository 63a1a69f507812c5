"""The Python API: load a target/draft pair once, generate with any registered method.

    from arborspec import SpeculativeGenerator
    gen = SpeculativeGenerator(method="dyspec", budget=32)          # embedded pair, CPU
    out = gen.generate("Why is the sky blue?", max_new_tokens=64)   # greedy: exactly the target's tokens
    print(out.text, out.mean_accepted_length)
    big = SpeculativeGenerator(target="Qwen/Qwen2.5-14B-Instruct", draft="ngram",
                               device_map="auto", max_memory="0=10GiB,cpu=20GiB")  # the rest offloaded to disk

Argument names mirror `transformers.generate`: `max_new_tokens`, `do_sample`,
`temperature`, `top_k`, `top_p`; plus `seed` for the generators.
"""

from __future__ import annotations

from typing import Any

from .builders import make_builder
from .common.chat import encode_prompt, eos_ids
from .engine.decode import DecodeConfig, SpeculativeDecoder, TokenCallback, autoregressive_generate
from .engine.sampling import sampling_config
from .engine.stats import GenerationInterrupted, GenerationResult
from .models import EMBEDDED_TARGET, ModelPair, check_same_vocabulary, default_draft, load_pair

# Re-exported: the names API users have imported from here.
__all__ = ["DEFAULT_BUDGET", "DEFAULT_METHOD", "ModelPair", "SpeculativeGenerator", "check_same_vocabulary",
           "default_draft", "encode_prompt", "eos_ids", "load_pair", "sampling_config"]

DEFAULT_METHOD = "dyspec"
DEFAULT_BUDGET = 16


class SpeculativeGenerator:
    """A loaded pair + a tree method; `generate()` returns a `GenerationResult` with per-step statistics."""

    def __init__(self, target: str = EMBEDDED_TARGET, draft: str | None = None, method: str = DEFAULT_METHOD,
                 device: str = "cpu", dtype: str = "float32", verifier: str | None = None, budget: int | str | None = None,
                 reorder_dfs: bool = False, pair: ModelPair | None = None, device_map: str | dict | None = None,
                 max_memory: str | dict | None = None, offload_folder: str | None = None, draft_logits: str = "auto",
                 compile: bool = False, lookup: int = 0, **method_params: Any) -> None:
        """`device_map` ("auto", a device, or {module: device} with "cpu"/"disk"), `max_memory`
        ("0=10GiB,cpu=20GiB" or a dict) and `offload_folder` place a target larger than memory
        (accelerate; see `arborspec.models.placement_kwargs`); they override `device`.
        `draft_logits`: a draft head's layer and logits in "int8" (the "auto" choice on CPU) or "float" (never changes the output).
        `compile`: run the target's decoder through `torch.compile` (one-off compilation on the first forwards).
        `lookup`: graft up to this many tokens copied from earlier in the context onto each tree (0: off; greedy and
        sample-and-match verification only, `engine/lookup.py`); never changes the output."""
        if budget is None and not method_params:
            budget = DEFAULT_BUDGET
        self.builder = make_builder(method, budget=budget, **method_params)
        self.pair = pair or load_pair(target, draft, device, dtype, device_map, max_memory, offload_folder, draft_logits)
        if compile:  # also for a pair loaded elsewhere; compiling twice is a no-op
            self.pair.target.compile()
        self.decoder = SpeculativeDecoder(self.pair.target, self.pair.drafter, self.builder, verifier=verifier,
                                          reorder_dfs=reorder_dfs, lookup=lookup)

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    def _config(self, max_new_tokens, do_sample, temperature, top_k, top_p, seed, draft_temperature=None) -> DecodeConfig:
        return DecodeConfig(max_new_tokens=max_new_tokens,
                            sampling=sampling_config(do_sample, temperature, top_k, top_p, draft_temperature),
                            seed=seed, eos_token_ids=eos_ids(self.tokenizer, self.pair.target.model))

    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, chat: bool = True,
                 on_tokens: TokenCallback | None = None, draft_temperature: float | None = None) -> GenerationResult:
        """`draft_temperature`: the draft side's temperature when greedy (None: the measured default);
        it changes speed only, never the output."""
        ids = encode_prompt(self.tokenizer, prompt, chat)
        cfg = self._config(max_new_tokens, do_sample, temperature, top_k, top_p, seed, draft_temperature)
        try:
            result = self.decoder.generate(ids, cfg, on_tokens)
        except GenerationInterrupted as stopped:  # Ctrl-C: the partial result carries its text too
            stopped.result.text = self.tokenizer.decode(stopped.result.output_ids, skip_special_tokens=True)
            raise
        result.text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        return result

    def generate_autoregressive(self, prompt: str | list[int], max_new_tokens: int = 128, do_sample: bool = False,
                                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                                chat: bool = True, on_tokens: TokenCallback | None = None,
                                draft_temperature: float | None = None) -> GenerationResult:
        """The plain baseline through the same adapter (same model, same prompt encoding)."""
        ids = encode_prompt(self.tokenizer, prompt, chat)
        result = autoregressive_generate(self.pair.target, ids, self._config(max_new_tokens, do_sample, temperature,
                                                                            top_k, top_p, seed), on_tokens)
        result.text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        return result
