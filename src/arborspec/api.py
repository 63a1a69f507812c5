"""The Python API: load a target/draft pair once, generate with any registered method.

    from arborspec import SpeculativeGenerator
    gen = SpeculativeGenerator()        # the embedded pair with this device's defaults
    print(gen.describe())               # what it runs: method, tree size, precision, ...
    out = gen.generate("Why is the sky blue?", max_new_tokens=64)  # greedy: the target's tokens
    print(out.text, out.mean_accepted_length)
    big = SpeculativeGenerator(target="Qwen/Qwen2.5-14B-Instruct", draft="ngram", device_map="auto",
                               max_memory="0=10GiB,cpu=20GiB")  # the rest offloaded to disk

Method, tree size, context lookup and precision default to the device's choice
(`arborspec.defaults`); explicit values always win. Argument names mirror
`transformers.generate`: `max_new_tokens`, `do_sample`, `temperature`, `top_k`, `top_p`; plus
`seed` for the generators.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .builders import make_builder
from .builders.shared_budget import SharedBudget
from .catalog import EMBEDDED_TARGET, EMBEDDED_TARGET_NAME, int8_by_default
from .common.chat import encode_prompt, eos_ids
from .defaults import AUTO, Defaults, choose, saved_dtype
from .drafters import ModelDrafter
from .engine.batch_decode import BatchDecoder, BatchInterrupted, BatchRequest
from .engine.decode import DecodeConfig, SpeculativeDecoder, TokenCallback, autoregressive_generate
from .engine.sampling import sampling_config
from .engine.stats import GenerationInterrupted, GenerationResult
from .errors import ArborError
from .models import (
    ModelPair,
    check_pair,
    default_draft,
    is_draft_model,
    load_pair,
    pair_from_models,
    planned_draft_precision,
    resolve_model_path,
)


class SpeculativeGenerator:
    """A loaded pair + a tree method; `generate()` returns a `GenerationResult` with per-step
    statistics. `settings` holds what it runs with (`arborspec.defaults.Defaults`); `describe()`
    says it in one line."""

    def __init__(
        self,
        target: str = EMBEDDED_TARGET,
        draft: str | None = None,
        method: str | None = None,
        device: str = "cpu",
        dtype: str = AUTO,
        verifier: str | None = None,
        budget: int | str | None = None,
        pair: ModelPair | None = None,
        device_map: str | dict | None = None,
        max_memory: str | dict | None = None,
        offload_folder: str | None = None,
        draft_logits: str = "auto",
        compile: bool = False,
        lookup: int | None = None,
        announce: Callable[[str], None] | None = None,
        **method_params: Any,
    ) -> None:
        """`method`, `budget`, `lookup` (None) and `dtype` ("auto") default to the device's choice
        (`arborspec.defaults.choose`: on CPU dyspec with a lookup of 6, int8 for the embedded
        target, 1 draft node on the int8 target and 3 on a float one; on a GPU 16 draft nodes, in
        the dtype the target was saved in); a method given without a budget or
        builder parameters gets the device's default budget.
        `device_map` ("auto", a device, or {module: device} with "cpu"/"disk"), `max_memory`
        ("0=10GiB,cpu=20GiB" or a dict) and `offload_folder` place a target larger than memory
        (accelerate; see `arborspec.models.placement_kwargs`); they override `device`.
        `draft_logits`: a draft head's layer and logits in "int8" (the "auto" choice on CPU) or
        "float" (never changes the output).
        `compile`: run the target's decoder through `torch.compile` (one-off compilation on the
        first forwards).
        `lookup`: graft up to this many tokens copied from earlier in the context onto each tree
        (0: off; with every verifier, `engine/lookup.py`); never changes the output's
        distribution.
        `pair`: a pair loaded elsewhere (`load_pair`); then target, draft, dtype and placement are
        its own.
        `announce`: called with `describe()`'s line once the settings are chosen, before any model
        loads (bad input fails before it)."""
        where = str(pair.target.device) if pair is not None else device
        embedded = int8_by_default(pair.target_name if pair is not None else target)
        placement = (None, None) if pair is not None else (device_map, max_memory)
        self.settings: Defaults = choose(
            where,
            embedded,
            *placement,
            method=method,
            budget=budget,
            lookup=lookup,
            dtype=pair.precision if pair is not None else dtype,
            builder_params=bool(method_params),
            checkpoint=lambda: saved_dtype(resolve_model_path(target)),
            draft_model=(
                isinstance(pair.drafter, ModelDrafter)
                if pair is not None
                else is_draft_model(draft or default_draft(target))
            ),
        )
        self.builder = make_builder(
            self.settings.method, budget=self.settings.budget, **method_params
        )
        dtype = self.settings.dtype
        if announce is not None and pair is not None:
            announce(self._describe_pair(pair))
        elif announce is not None:
            _, int8_draft = check_pair(
                target, draft, device, dtype, device_map, max_memory, offload_folder, draft_logits
            )
            placed = device_map is not None or max_memory is not None
            draft = draft or default_draft(target)
            shown = planned_draft_precision(draft, dtype, int8_draft)
            announce(
                self._line(
                    target,
                    draft + (f" ({shown})" if shown else ""),
                    dtype,
                    "device map" if placed else device,
                )
            )
        self.pair = pair or load_pair(
            target, draft, device, dtype, device_map, max_memory, offload_folder, draft_logits
        )
        if compile:  # also for a pair loaded elsewhere; compiling twice is a no-op
            self.pair.target.compile()
        self.decoder = SpeculativeDecoder(
            self.pair.target,
            self.pair.drafter,
            self.builder,
            verifier=verifier,
            lookup=self.settings.lookup,
        )

    @classmethod
    def from_models(
        cls,
        model,
        tokenizer=None,
        draft=None,
        method: str | None = None,
        budget: int | str | None = None,
        lookup: int | None = None,
        verifier: str | None = None,
        draft_tokenizer=None,
        draft_logits: str = "auto",
        announce: Callable[[str], None] | None = None,
        **method_params: Any,
    ) -> SpeculativeGenerator:
        """A generator around a model (and tokenizer) the caller already loaded, in whatever
        precision and placement it has; the model is used as it is and never changed.

        `draft`: None (the shipped head for the embedded target, a head directory
        `arborspec-head` inside the model's directory, else "ngram"), "ngram", a draft-head
        directory, a loaded `DraftHead`, a draft model (loaded, or its id or directory; with
        `draft_tokenizer` a loaded draft's tokenizer is checked against the target's). Method,
        budget and lookup default as for a target loaded by name on the model's device."""
        pair = pair_from_models(model, tokenizer, draft, draft_tokenizer, draft_logits)
        return cls(
            pair=pair,
            method=method,
            budget=budget,
            lookup=lookup,
            verifier=verifier,
            announce=announce,
            **method_params,
        )

    def describe(self) -> str:
        """One line: method, tree size, lookup, the target with its precision and device, the
        draft with its precision, the baseline; e.g. `dyspec, 1 draft node + lookup 6 | target
        embedded SmolLM2-135M-Instruct (int8, cpu) | draft embedded-head (int8) | baseline: plain
        decoding of the same int8 target`."""
        return self._describe_pair(self.pair)

    def _describe_pair(self, pair: ModelPair) -> str:
        placed = ", device map" if getattr(pair.target.model, "hf_device_map", None) else ""
        draft = pair.draft_name + (f" ({pair.draft_precision})" if pair.draft_precision else "")
        return self._line(pair.target_name, draft, pair.precision, f"{pair.target.device}{placed}")

    def _line(self, target: str, draft: str, precision: str, where: str) -> str:
        s, b = self.settings, self.builder
        nodes = f"{b.budget} draft node{'' if b.budget == 1 else 's'}"
        size = f"auto-sized trees of at most {nodes}" if b.needs_cost else nodes
        method = f"{b.name}, {size}" + (f" + lookup {s.lookup}" if s.lookup else "")
        shown = f"{target} {EMBEDDED_TARGET_NAME}" if target == EMBEDDED_TARGET else target
        return (
            f"{method} | target {shown} ({precision}, {where}) | draft {draft} | "
            f"baseline: plain decoding of the same {precision} target"
        )

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    def _config(
        self, max_new_tokens, do_sample, temperature, top_k, top_p, seed, draft_temperature=None
    ) -> DecodeConfig:
        return DecodeConfig(
            max_new_tokens=max_new_tokens,
            sampling=sampling_config(do_sample, temperature, top_k, top_p, draft_temperature),
            seed=seed,
            eos_token_ids=eos_ids(self.tokenizer, self.pair.target.model),
        )

    def generate(
        self,
        prompt: str | list[int],
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        chat: bool = True,
        on_tokens: TokenCallback | None = None,
        draft_temperature: float | None = None,
    ) -> GenerationResult:
        """`draft_temperature`: the draft side's temperature when greedy (None: the measured
        default); it changes speed only, never the output."""
        cfg = self._config(
            max_new_tokens, do_sample, temperature, top_k, top_p, seed, draft_temperature
        )
        return self._run(lambda ids: self.decoder.generate(ids, cfg, on_tokens), prompt, chat)

    def generate_autoregressive(
        self,
        prompt: str | list[int],
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        chat: bool = True,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        """The plain baseline through the same adapter (same model, same prompt encoding)."""
        cfg = self._config(max_new_tokens, do_sample, temperature, top_k, top_p, seed)
        return self._run(
            lambda ids: autoregressive_generate(self.pair.target, ids, cfg, on_tokens), prompt, chat
        )

    def generate_batch(
        self,
        prompts: list[str | list[int]],
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        chat: bool = True,
        max_requests: int = 64,
        max_rows: int = 256,
        shared_budget: SharedBudget | None = None,
        on_tokens: Callable[[int, list[int]], None] | None = None,
        draft_temperature: float | None = None,
    ) -> list[GenerationResult]:
        """Decode several prompts together (engine/batch_decode.py): one target forward per step for
        every request in flight, at most `max_requests` of them and `max_rows` rows per forward.
        Prompt i is sampled with seed `seed + i`. `shared_budget`: grow every request's tree from
        one heap sized by the batch's measured costs (builders/shared_budget.py) instead of this
        generator's per-request budget. `on_tokens(i, tokens)`: each step's new tokens of prompt
        i. Results in the order of `prompts`; greedy on the int8 target, each is exactly the
        one `generate` gives that prompt alone."""
        cfg = self._config(
            max_new_tokens, do_sample, temperature, top_k, top_p, seed, draft_temperature
        )
        return self._run_batch(
            prompts, cfg, chat, True, max_requests, max_rows, shared_budget, on_tokens
        )

    def generate_autoregressive_batch(
        self,
        prompts: list[str | list[int]],
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        chat: bool = True,
        max_requests: int = 64,
        max_rows: int = 256,
        on_tokens: Callable[[int, list[int]], None] | None = None,
    ) -> list[GenerationResult]:
        """The plain baseline of `generate_batch`: the same batching, no drafting."""
        cfg = self._config(max_new_tokens, do_sample, temperature, top_k, top_p, seed)
        return self._run_batch(prompts, cfg, chat, False, max_requests, max_rows, None, on_tokens)

    def _run_batch(
        self, prompts, cfg, chat, speculative, max_requests, max_rows, shared, on_tokens
    ) -> list[GenerationResult]:
        if self.tokenizer is None and not all(isinstance(p, list) for p in prompts):
            raise ArborError(
                "text prompts need the target's tokenizer: pass it to from_models, or give "
                "token ids"
            )
        decoder = BatchDecoder(
            self.pair.target,
            self.pair.drafter if speculative else None,
            max_rows=max_rows,
            max_requests=max_requests,
            shared=shared,
        )
        handles = []
        for i, prompt in enumerate(prompts):
            callback = None if on_tokens is None else (lambda tokens, i=i: on_tokens(i, tokens))
            request = BatchRequest(
                encode_prompt(self.tokenizer, prompt, chat),
                dataclasses.replace(cfg, seed=cfg.seed + i),
                self.builder if speculative else None,
                lookup=self.settings.lookup if speculative else 0,
                on_tokens=callback,
            )
            handles.append(decoder.submit(request))
        try:
            decoder.run()
        except KeyboardInterrupt:
            for handle in handles:  # what each request generated so far is kept
                decoder.cancel(handle)
            raise BatchInterrupted([self._texted(h.result) for h in handles]) from None
        return [self._texted(h.result) for h in handles]

    def _texted(self, result: GenerationResult) -> GenerationResult:
        result.text = self._text(result.output_ids)
        return result

    def _run(
        self, decode: Callable[[list[int]], GenerationResult], prompt: str | list[int], chat: bool
    ) -> GenerationResult:
        """Encode `prompt`, decode it, and attach the text, also to the partial result that
        Ctrl-C leaves (`GenerationInterrupted`)."""
        if self.tokenizer is None and not isinstance(prompt, list):
            raise ArborError(
                "a text prompt needs the target's tokenizer: pass it to from_models, or give "
                "token ids"
            )
        try:
            result = decode(encode_prompt(self.tokenizer, prompt, chat))
        except GenerationInterrupted as stopped:
            stopped.result.text = self._text(stopped.result.output_ids)
            raise
        result.text = self._text(result.output_ids)
        return result

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)
