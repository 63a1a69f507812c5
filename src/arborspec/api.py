"""The Python API: load a target/draft pair once, generate with any registered method.

    from arborspec import SpeculativeGenerator
    gen = SpeculativeGenerator(method="dyspec", budget=32)          # embedded pair, CPU
    out = gen.generate("Why is the sky blue?", max_new_tokens=64)   # greedy: exactly the target's tokens
    print(out.text, out.mean_accepted_length)

Argument names mirror `transformers.generate`: `max_new_tokens`, `do_sample`,
`temperature`, `top_k`, `top_p`; plus `seed` for the generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine.adapter import ModelAdapter
from .engine.decode import DecodeConfig, SpeculativeDecoder, TokenCallback, autoregressive_generate
from .drafters import Drafter, ModelDrafter, NgramDrafter
from .errors import ArborError
from .models import (EMBEDDED_DRAFT, EMBEDDED_HEAD, EMBEDDED_TARGET, NGRAM_DRAFT, SHIPPED_DRAFT_DIR, SHIPPED_HEAD_DIR,
                     is_head_dir, load_model, load_tokenizer, parse_dtype, resolve_head_dir, resolve_model_path)
from .builders.registry import make_builder
from .engine.sampling import SamplingConfig
from .engine.stats import GenerationResult

DEFAULT_METHOD = "dyspec"
DEFAULT_BUDGET = 16


def default_draft(target: str) -> str:
    """For the embedded target its shipped draft head (else its distilled draft); else the model-free n-gram drafter."""
    if target == EMBEDDED_TARGET and (SHIPPED_HEAD_DIR / "head.json").is_file():
        return EMBEDDED_HEAD
    if target == EMBEDDED_TARGET and (SHIPPED_DRAFT_DIR / "config.json").is_file():
        return EMBEDDED_DRAFT
    return NGRAM_DRAFT


@dataclass
class ModelPair:
    """A loaded target (wrapped in its adapter), a drafter and the target's tokenizer."""

    target_name: str
    draft_name: str
    target: ModelAdapter
    drafter: Drafter
    tokenizer: Any


def check_same_vocabulary(target_model, target_tok, draft_model, draft_name: str) -> None:
    """Refuse a draft whose vocabulary differs from the target's (speculation would be meaningless)."""
    t_rows = target_model.get_output_embeddings().weight.shape[0]
    d_rows = draft_model.get_output_embeddings().weight.shape[0]
    if t_rows != d_rows:
        raise ArborError(
            f"draft {draft_name!r} has a vocabulary of {d_rows} tokens, the target {t_rows}: "
            "use a draft model trained with the target's tokenizer (or --draft ngram)"
        )
    try:
        draft_tok = load_tokenizer(draft_name)
    except ArborError:
        return  # a draft without its own tokenizer files is accepted on matching vocabulary size
    if draft_tok.get_vocab() != target_tok.get_vocab():
        raise ArborError(f"draft {draft_name!r} uses a different tokenizer from the target: pick a draft of the same family")


def load_pair(target: str = EMBEDDED_TARGET, draft: str | None = None, device: str = "cpu", dtype: str = "float32",
              device_map: str | dict | None = None) -> ModelPair:
    """Load the target and the drafter.

    `draft`: a draft-head directory or "embedded-head" (EAGLE-style head on the target's features),
    a draft model id/dir or "embedded-draft", or "ngram".
    """
    draft = draft or default_draft(target)
    if draft != NGRAM_DRAFT and not is_head_dir(draft):
        resolve_model_path(draft)  # a missing draft path fails before the target is loaded
    tokenizer = load_tokenizer(target)
    target_model = load_model(target, device, dtype, device_map=device_map)
    adapter = ModelAdapter(target_model)
    if draft == NGRAM_DRAFT:
        drafter: Drafter = NgramDrafter(adapter.vocab_size)
    elif is_head_dir(draft):
        from .drafters.head import HeadDrafter, load_head

        drafter = HeadDrafter(load_head(resolve_head_dir(draft), target_model, parse_dtype(dtype)))
    else:
        draft_model = load_model(draft, adapter.device, dtype)
        check_same_vocabulary(target_model, tokenizer, draft_model, draft)
        drafter = ModelDrafter(draft_model)
    return ModelPair(target, draft, adapter, drafter, tokenizer)


def encode_prompt(tokenizer, prompt: str | list[int], chat: bool = True) -> list[int]:
    """Token ids for a prompt: the chat template for instruct models (when `chat`), raw text otherwise."""
    if isinstance(prompt, list):
        ids = [int(t) for t in prompt]
    else:
        if not prompt or not prompt.strip():
            raise ArborError("the prompt is empty: give some text to continue")
        if chat and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
    if not ids:
        raise ArborError("the prompt is empty: give some text to continue")
    return ids


def eos_ids(tokenizer, model=None) -> tuple[int, ...]:
    ids = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return tuple(sorted(ids))


def sampling_config(do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> SamplingConfig:
    """HF semantics: `do_sample=False` is greedy whatever the temperature; temperature 0 is greedy too."""
    if temperature is not None and temperature < 0:
        raise ArborError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not do_sample or temperature == 0:
        return SamplingConfig(0.0, top_k, top_p)
    return SamplingConfig(temperature, top_k, top_p)


class SpeculativeGenerator:
    """A loaded pair + a tree method; `generate()` returns a `GenerationResult` with per-step statistics."""

    def __init__(self, target: str = EMBEDDED_TARGET, draft: str | None = None, method: str = DEFAULT_METHOD,
                 device: str = "cpu", dtype: str = "float32", verifier: str | None = None, budget: int | None = None,
                 reorder_dfs: bool = False, pair: ModelPair | None = None, **method_params: Any) -> None:
        if budget is None and not method_params:
            budget = DEFAULT_BUDGET
        self.builder = make_builder(method, budget=budget, **method_params)
        self.pair = pair or load_pair(target, draft, device, dtype)
        self.decoder = SpeculativeDecoder(self.pair.target, self.pair.drafter, self.builder, verifier, reorder_dfs)

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    def _config(self, max_new_tokens, do_sample, temperature, top_k, top_p, seed) -> DecodeConfig:
        return DecodeConfig(max_new_tokens, sampling_config(do_sample, temperature, top_k, top_p), seed,
                            eos_ids(self.tokenizer, self.pair.target.model))

    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, chat: bool = True,
                 on_tokens: TokenCallback | None = None) -> GenerationResult:
        ids = encode_prompt(self.tokenizer, prompt, chat)
        result = self.decoder.generate(ids, self._config(max_new_tokens, do_sample, temperature, top_k, top_p, seed), on_tokens)
        result.text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        return result

    def generate_autoregressive(self, prompt: str | list[int], max_new_tokens: int = 128, do_sample: bool = False,
                                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                                chat: bool = True, on_tokens: TokenCallback | None = None) -> GenerationResult:
        """The plain baseline through the same adapter (same model, same prompt encoding)."""
        ids = encode_prompt(self.tokenizer, prompt, chat)
        result = autoregressive_generate(self.pair.target, ids, self._config(max_new_tokens, do_sample, temperature,
                                                                            top_k, top_p, seed), on_tokens)
        result.text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        return result
