"""`arborspec.generate`: tree speculation inside `transformers`' own `generate`.

    out = model.generate(**inputs, max_new_tokens=128, custom_generate=arborspec.generate,
                         draft="ngram", method="dyspec", budget=8)

`generate` prepares the inputs, the generation config, the logits processors and the stopping
criteria as usual and hands them to this callable instead of its own decoding loop
(`custom_generate`, transformers >= 4.56). What it honours:

* the generation config: `max_new_tokens` / `max_length`, `do_sample`, `eos_token_id` (a list
  too), and every built-in processor it implies (temperature, top-k, top-p, min-p, typical,
  epsilon, eta, `repetition_penalty`, `no_repeat_ngram_size`, `min_length`, `min_new_tokens`,
  `bad_words_ids`, `sequence_bias`, suppressed and forced tokens, `prefix_allowed_tokens_fn`):
  each is applied exactly, to every tree node on that node's own path, on the target side (the
  distribution the verifier checks against) and on the draft side (engine/processors.py). So the
  output is the one `generate` would give: identical tokens when greedy, the same distribution
  when sampling. A processor class that is not one of transformers' own is refused in one line;
* stopping criteria, asked after every committed token as `generate` does; stop strings through
  `stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, [...])])` (a
  `stop_strings=` argument fails inside `generate` before this callable runs: transformers does
  not pass its tokenizer on);
* `streamer=` (`TextStreamer`, `TextIteratorStreamer`, ...): after the prompt, which `generate`
  itself puts, it receives every committed token once, in order, then `end()`;
* `return_dict_in_generate=True`: `sequences` plus `arborspec`, the `GenerationResult` with the
  per-step statistics.

A batch of prompts (left padding) is decoded together, one target forward per step for every
row (engine/batch_decode.py; row i sampled with seed `seed + i`), each row as its prompt alone
(its processors see its own tokens, no padding), and padded after its end as `generate` pads
it; `min_length` / `min_new_tokens`, which count the padded length, are refused for a padded
batch. `num_beams > 1`, `num_return_sequences > 1`, `output_scores`, `output_logits`,
`output_attentions` and `output_hidden_states` are refused in one line. Extra keywords: `draft`
(None: the shipped head for the embedded target, a head in `<model dir>/arborspec-head`, else
"ngram"; or a head directory, a draft model or its name, a `DraftHead`), `method`, `budget`,
`lookup`, `verifier`, `draft_logits`, `builder_params` (the method's other parameters, a dict)
and `seed` (None: drawn from torch's global generator, so `torch.manual_seed` makes sampling
repeatable).

The caller's model is used as it is and left as it was: no layer swapped, no precision,
attention implementation or compilation changed, no hook left after the call. What is built
around it (the adapter with its LM-head copy, the drafter, the builder) is kept per model and
settings for the next call.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .api import SpeculativeGenerator
from .engine.batch_decode import BatchDecoder, BatchRequest
from .engine.decode import DecodeConfig
from .engine.sampling import SamplingConfig
from .engine.stats import GenerationResult
from .errors import ArborError

# transformers' processors that are functions of (input_ids, scores) alone: exact per tree node
PER_NODE_PROCESSORS = (
    lp.MinLengthLogitsProcessor,
    lp.MinNewTokensLengthLogitsProcessor,
    lp.TemperatureLogitsWarper,
    lp.RepetitionPenaltyLogitsProcessor,
    lp.TopPLogitsWarper,
    lp.TopKLogitsWarper,
    lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper,
    lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper,
    lp.NoRepeatNGramLogitsProcessor,
    lp.SequenceBiasLogitsProcessor,  # NoBadWordsLogitsProcessor too
    lp.PrefixConstrainedLogitsProcessor,
    lp.ForcedBOSTokenLogitsProcessor,
    lp.ForcedEOSTokenLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
    lp.ExponentialDecayLengthPenalty,
    lp.LogitNormalization,
    lp.SuppressTokensAtBeginLogitsProcessor,
    lp.SuppressTokensLogitsProcessor,
)
# generation-config flags this callable cannot honour
REFUSED = {
    "num_beams": "beam search",
    "num_return_sequences": "several sequences per prompt",
    "output_scores": "per-token scores",
    "output_logits": "per-token logits",
    "output_attentions": "attentions",
    "output_hidden_states": "hidden states",
}


@dataclass
class ArborspecGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate`'s output with `return_dict_in_generate=True`: `sequences` (prompt + new
    tokens, `[1, L]`) and `arborspec`, the generation's result with its per-step statistics."""

    arborspec: GenerationResult | None = None


# model -> {settings: generator}: what is built around a model, kept for its next call
_GENERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    draft=None,
    method: str | None = None,
    budget: int | str | None = None,
    lookup: int | None = None,
    verifier: str | None = None,
    draft_logits: str = "auto",
    seed: int | None = None,
    builder_params: dict | None = None,
    streamer=None,
    **model_kwargs: Any,
):
    """The `custom_generate` callable (module docstring): one sequence, tree speculation,
    `generate`'s output."""
    config = generation_config if generation_config is not None else model.generation_config
    check_config(config)
    if input_ids.dim() != 2:
        raise ArborError(
            f"arborspec.generate takes input_ids of shape [batch, length], got "
            f"{tuple(input_ids.shape)}: pass the tokenizer's input_ids"
        )
    mask = model_kwargs.get("attention_mask")
    prompts = [unpadded(input_ids[i : i + 1], None if mask is None else mask[i : i + 1])
               for i in range(input_ids.shape[0])]
    max_new = (config.max_length or 0) - input_ids.shape[1]
    if max_new < 1:
        raise ArborError(
            f"max_length {config.max_length} leaves no room after the prompt's "
            f"{input_ids.shape[1]} tokens: set max_new_tokens"
        )
    streamer = streamer if streamer is not None else _generate_streamer()
    processors = per_node_processors(logits_processor)
    if processors and any(len(p) < input_ids.shape[1] for p in prompts) and any(
        isinstance(p, LENGTH_PROCESSORS) for p in processors
    ):
        raise ArborError(
            "min_length / min_new_tokens count the padded length of a left-padded batch, while "
            "arborspec decodes each row as its prompt alone: generate such prompts one per call"
        )
    cfg = DecodeConfig(
        max_new_tokens=max_new,
        # the processors carry temperature, top-k and top-p: the verifier samples their output
        sampling=SamplingConfig(1.0) if config.do_sample else SamplingConfig(0.0),
        seed=_seed(seed, config.do_sample),
        eos_token_ids=eos_token_ids(config),
        logits_processor=processors,
        stopping=stop_check(stopping_criteria, input_ids.device),
    )
    gen = generator_for(
        model, draft, method, budget, lookup, verifier, draft_logits, builder_params or {}
    )
    if len(prompts) > 1:
        return _generate_batch(gen, input_ids, prompts, cfg, config, verifier)
    on_tokens = None
    if streamer is not None:

        def on_tokens(new: list[int]) -> None:
            streamer.put(torch.tensor(new, dtype=torch.long))

    try:
        result = gen.decoder.generate(prompts[0], cfg, on_tokens)
    finally:
        if streamer is not None:
            streamer.end()
        # no hook left on the caller's model, no KV cache kept alive between calls
        gen.pair.target.capture_hidden(False)
        gen.pair.target.reset()
        gen.pair.drafter.reset()
    new = torch.tensor([result.output_ids], dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=1)
    if config.return_dict_in_generate:
        return ArborspecGenerateOutput(sequences=sequences, arborspec=result)
    return sequences


def _generate_batch(gen, input_ids, prompts, cfg, config, verifier):
    """A batch of prompts decoded together (engine/batch_decode.py), row i sampled with seed
    `seed + i`; `generate`'s output: each row its input (left padding kept) and new tokens,
    finished rows padded after their end with the pad token (else the first EOS), as `generate`
    pads them; `arborspec` is then the list of the rows' results."""
    decoder = BatchDecoder(gen.pair.target, gen.pair.drafter)
    if cfg.logits_processor is not None:
        cfg = dataclasses.replace(cfg, logits_processor=unbatched(cfg.logits_processor))
    handles = [
        decoder.submit(
            BatchRequest(
                prompt,
                dataclasses.replace(cfg, seed=cfg.seed + i),
                gen.builder,
                lookup=gen.settings.lookup,
                verifier=verifier,
            )
        )
        for i, prompt in enumerate(prompts)
    ]
    try:
        decoder.run()
    finally:
        gen.pair.target.reset()
    results = [h.result for h in handles]
    longest = max(len(r.output_ids) for r in results)
    pad = config.pad_token_id
    if pad is None:
        pad = cfg.eos_token_ids[0] if cfg.eos_token_ids else 0
    new = torch.tensor(
        [r.output_ids + [pad] * (longest - len(r.output_ids)) for r in results],
        dtype=input_ids.dtype,
        device=input_ids.device,
    )
    sequences = torch.cat([input_ids, new], dim=1)
    if config.return_dict_in_generate:
        return ArborspecGenerateOutput(sequences=sequences, arborspec=results)
    return sequences


def unbatched(processors: lp.LogitsProcessorList) -> lp.LogitsProcessorList:
    """The processors for one row of a batch, decoded as its prompt alone: the repetition
    penalty's per-row padding lengths (which `generate` sets to keep pad tokens out of it) dropped,
    since a row's own tokens hold no padding."""
    rows = lp.LogitsProcessorList()
    for p in processors:
        if isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor):
            p = copy.copy(p)
            p.prompt_ignore_length = None
        rows.append(p)
    return rows


def _seed(seed: int | None, sampling: bool) -> int:
    """The request's seed: given, or (sampling only) drawn from torch's global generator as
    `generate`'s own sampling would draw from it."""
    if seed is not None or not sampling:
        return seed or 0
    return int(torch.randint(0, 2**62, (1,)))


def check_config(config) -> None:
    """One line for each generation setting this callable cannot honour."""
    for name, what in REFUSED.items():
        value = getattr(config, name, None)
        if value is True or (type(value) is int and value > 1):
            raise ArborError(
                f"arborspec.generate does not do {what} ({name}={value}): drop it, or call "
                "generate without custom_generate"
            )


def unpadded(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[int]:
    """The prompt's ids without its left padding (positions then count from its first real token,
    as `generate` counts them); padding anywhere else is refused."""
    ids = input_ids[0].tolist()
    if attention_mask is None:
        return ids
    mask = attention_mask[0].tolist()
    start = next((i for i, m in enumerate(mask) if m), len(mask))
    if start == len(mask) or not all(mask[start:]):
        raise ArborError(
            "the attention mask leaves padding inside or after the prompt: pass one unpadded "
            "prompt (or left padding only)"
        )
    return ids[start:]


def per_node_processors(processors) -> lp.LogitsProcessorList | None:
    """The prepared processors, if every one can be applied per tree node; None when there are
    none (raw rows, greedy screen). Others are refused, by name."""
    if not processors:
        return None
    foreign = sorted({type(p).__name__ for p in processors if type(p) not in _ALLOWED})
    if foreign:
        raise ArborError(
            f"arborspec.generate cannot apply {', '.join(foreign)} to each tree node: use "
            "transformers' built-in processors (generation-config options), or generate without "
            "custom_generate"
        )
    return processors


_ALLOWED = frozenset(PER_NODE_PROCESSORS) | {lp.NoBadWordsLogitsProcessor}
# processors that count the length of the (padded) input
LENGTH_PROCESSORS = (lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor)


def eos_token_ids(config) -> tuple[int, ...]:
    eos = config.eos_token_id
    if eos is None:
        return ()
    return tuple(sorted({int(e) for e in ([eos] if isinstance(eos, int) else eos)}))


def stop_check(criteria, device):
    """`generate`'s stopping criteria as the decoder's per-token check, without the length and
    EOS criteria the decoder applies itself (None when nothing else is left); they read the
    sequence so far (scores are not kept: None)."""
    criteria = StoppingCriteriaList(
        c for c in criteria or () if type(c) not in (MaxLengthCriteria, EosTokenCriteria)
    )
    if not criteria:
        return None

    def check(sequence: list[int]) -> bool:
        ids = torch.tensor([sequence], dtype=torch.long, device=device)
        return bool(criteria(ids, None)[0])

    return check


def _generate_streamer():
    """The streamer handed to `generate`, which transformers keeps from a callable
    `custom_generate` (it has already put the prompt into it): read from `generate`'s frame."""
    frame = sys._getframe(2)  # 0: here, 1: arborspec.generate, 2: its caller
    for _ in range(4):
        if frame is None:
            return None
        local = frame.f_locals
        if frame.f_code.co_name == "generate" and "generation_mode_kwargs" in local:
            return local.get("streamer")
        frame = frame.f_back
    return None


def generator_for(model, draft, method, budget, lookup, verifier, draft_logits, builder_params):
    """The generator around `model` for these settings, built on first use and kept (weakly, by
    model) for the next call."""
    key = (
        draft,  # a name, or a loaded draft (hashed by identity)
        method,
        budget,
        lookup,
        verifier,
        draft_logits,
        tuple(sorted(builder_params.items())),
    )
    kept = _GENERATORS.setdefault(model, {})
    if key not in kept:
        kept[key] = SpeculativeGenerator.from_models(
            model,
            draft=draft,
            method=method,
            budget=budget,
            lookup=lookup,
            verifier=verifier,
            draft_logits=draft_logits,
            **builder_params,
        )
    return kept[key]
