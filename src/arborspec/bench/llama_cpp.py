"""llama.cpp as a peer in `arborspec bench`: what a CPU user would run instead.

`arborspec bench --compare-llama-cpp` times llama.cpp (through the `llama-cpp-python` bindings,
installed in the benchmark's environment, not a dependency of arborspec) on the same prompts, in
the same process and interleaved with arborspec's plain and speculative decoding, and records its
runs like any other method: tokens counted the same way (new tokens up to EOS or
`max_new_tokens`), the wall time from before the prompt's prefill to the last token, so the
report's tokens/s and its ratio to plain decoding sit side by side with the others'. Its labels:

* `llama.cpp`: its plain decoding;
* `llama.cpp:lookup=10`: its speculative decoding with the bindings' prompt-lookup draft
  (`LlamaPromptLookupDecoding`, its default of 10 tokens copied from earlier in the context);
* `llama.cpp:draft-model`: its speculative decoding with a draft model's GGUF (the pair's draft,
  when it has one): the draft proposes greedily up to `DRAFT_MAX` tokens, stopping where its top
  token's probability falls below `DRAFT_P_MIN` (llama.cpp's server defaults for `--draft-max`
  and `--draft-p-min`), its KV cache kept across steps.

The bindings verify a draft by sampling the target at each drafted position and keeping the draft
while they match, so at temperature 0 its speculative output should be its own plain output; it is
not guaranteed (llama.cpp's batched forwards round differently from its one-row forwards), so each
speculative run at T = 0 records whether it equals llama.cpp's plain run of the same prompt.

llama.cpp runs the GGUF file itself (for the embedded target, the Q4_1 file arborspec dequantises):
it computes with 4-bit weights and 8-bit activations, a different model numerically from either
arborspec target, so its tokens are not compared with arborspec's plain decoding
(docs/evaluation.md).

Prompts are fed as the same token ids arborspec decodes (the GGUF's vocabulary is the one the
converted tokenizer was made from; a GGUF with another vocabulary size is refused). Every
generation starts from an empty KV cache: the bindings would otherwise reuse the longest common
prefix of the previous generation's tokens and skip part of the prefill.
"""

from __future__ import annotations

from pathlib import Path

from ..common.timing import clock
from ..errors import ArborError

LLAMA_CPP = "llama.cpp"  # the label of its plain runs in results files and reports
LOOKUP_TOKENS = 10  # LlamaPromptLookupDecoding's default num_pred_tokens
LLAMA_CPP_LOOKUP = f"{LLAMA_CPP}:lookup={LOOKUP_TOKENS}"
LLAMA_CPP_DRAFT = f"{LLAMA_CPP}:draft-model"
DRAFT_MAX = 16  # llama.cpp server's --draft-max default
DRAFT_P_MIN = 0.75  # llama.cpp server's --draft-p-min default
# llama.cpp's context: the prompt and its answer fit; speculative runs keep a row of logits per
# position (context x vocabulary floats), so not the model's whole window
LLAMA_CPP_CONTEXT = 4096
PIP = 'pip install "llama-cpp-python==0.3.36"'  # builds llama.cpp from source: ~10 min on 2 cores


def is_llama_cpp(label: str) -> bool:
    """Whether a benchmark label names one of llama.cpp's runs."""
    return label == LLAMA_CPP or label.startswith(LLAMA_CPP + ":")


def _llama_class():
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ArborError(
            f"--compare-llama-cpp needs llama-cpp-python in this environment: {PIP}"
        ) from None
    return Llama


def _load(path: Path, threads: int, context: int, vocab_size: int, what: str, **kwargs):
    """A GGUF loaded by llama.cpp, its vocabulary checked against the target's."""
    Llama = _llama_class()
    if not path.is_file():
        raise ArborError(f"GGUF file {str(path)!r} does not exist: check {what}")
    try:
        llm = Llama(
            model_path=str(path),
            n_ctx=context,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            **kwargs,
        )
    except (ValueError, RuntimeError) as exc:
        raise ArborError(f"llama.cpp cannot load {path.name} ({exc}): check {what}") from None
    if llm.n_vocab() != vocab_size:
        raise ArborError(
            f"{path.name} has {llm.n_vocab()} tokens, the target {vocab_size}: give "
            f"{what} the GGUF file of the benchmarked model"
        )
    return llm


def _draft_model(llm, n_max: int, p_min: float):
    """A `LlamaDraftModel` (the bindings' draft interface) over the loaded draft GGUF `llm`: from
    the tokens so far, its greedy continuation of up to `n_max` tokens, stopped before a token whose
    probability is below `p_min`; the draft's KV cache keeps the prefix it shares with the call."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GGUFDraft(LlamaDraftModel):
        def __call__(self, input_ids, /, **kwargs):
            ids = input_ids.tolist()
            seen = llm.input_ids[: llm.n_tokens].tolist()
            shared = 0
            for a, b in zip(seen, ids):
                if a != b:
                    break
                shared += 1
            llm.n_tokens = min(shared, len(ids) - 1)  # eval() drops the cache rows past it
            llm.eval(ids[llm.n_tokens :])
            out: list[int] = []
            while len(out) < n_max:
                logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
                token = int(logits.argmax())
                if 1.0 / float(np.exp(logits - logits[token]).sum()) < p_min:
                    break
                out.append(token)
                if len(out) < n_max:
                    llm.eval([token])
            return np.array(out, dtype=np.intc)

        def reset(self) -> None:
            llm.reset()

    return GGUFDraft()


class LlamaCppPeer:
    """llama.cpp on one GGUF: plain decoding and, from `labels()`, its speculative decoding with
    prompt lookup and (given `draft_gguf`) with a draft model (module doc)."""

    def __init__(
        self,
        gguf: str | Path,
        threads: int,
        context: int,
        vocab_size: int,
        draft_gguf: str | Path | None = None,
    ) -> None:
        self.path, self.threads = Path(gguf), threads
        self.llm = _load(self.path, threads, context, vocab_size, "--gguf")
        # speculative runs keep every row's logits (the bindings sample each drafted position)
        self._spec = None
        self._args = (threads, context, vocab_size)
        self.draft_path = None if draft_gguf is None else Path(draft_gguf)
        self._draft = None
        if self.draft_path is not None:
            draft_llm = _load(self.draft_path, threads, context, vocab_size, "the draft's GGUF")
            self._draft = _draft_model(draft_llm, DRAFT_MAX, DRAFT_P_MIN)

    def labels(self) -> list[str]:
        """Its runs' labels: plain, prompt lookup, and the draft model when it has one."""
        return [LLAMA_CPP, LLAMA_CPP_LOOKUP] + ([LLAMA_CPP_DRAFT] if self._draft else [])

    def describe(self, label: str = LLAMA_CPP) -> str:
        how = {
            LLAMA_CPP: "plain decoding",
            LLAMA_CPP_LOOKUP: f"speculative decoding with prompt lookup ({LOOKUP_TOKENS} tokens)",
            LLAMA_CPP_DRAFT: (
                f"speculative decoding with the draft model "
                f"{self.draft_path.name if self.draft_path else ''} (up to {DRAFT_MAX} tokens, "
                f"p_min {DRAFT_P_MIN})"
            ),
        }[label]
        return f"{LLAMA_CPP} {how} of {self.path.name} ({self.threads} threads)"

    def _speculative(self, label: str):
        """The target loaded for speculative runs, its draft set for `label`."""
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        if self._spec is None:
            threads, context, vocab_size = self._args
            self._spec = _load(
                self.path, threads, context, vocab_size, "--gguf",
                draft_model=LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS),
            )  # fmt: skip
        if label == LLAMA_CPP_DRAFT:
            self._draft.reset()
            self._spec.draft_model = self._draft
        else:
            self._spec.draft_model = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS)
        return self._spec

    def generate(
        self,
        label: str,
        ids: list[int],
        max_new_tokens: int,
        eos: list[int],
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
    ) -> tuple[list[int], float, str]:
        """The run `label` (one of `labels()`): (new token ids, wall seconds, stop reason "eos" or
        "length"); greedy at temperature 0, else sampled with llama.cpp's own sampler (its top-k /
        top-p; no min-p, no penalty)."""
        if label not in self.labels():
            raise ArborError(f"no llama.cpp run {label!r}: choose one of {self.labels()}")
        out: list[int] = []
        stop = "length"
        t0 = clock()
        llm = self.llm if label == LLAMA_CPP else self._speculative(label)
        llm.reset()  # an empty cache: no prefix kept from the previous generation
        llm.set_seed(seed)
        tokens = llm.generate(
            ids,
            temp=temperature,  # 0: llama.cpp's greedy sampler
            top_k=top_k,  # 0: the whole vocabulary
            top_p=top_p,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            reset=True,
        )
        for token in tokens:
            out.append(int(token))
            if token in eos:
                stop = "eos"
                break
            if len(out) >= max_new_tokens:
                break
        wall = clock() - t0
        return out, wall, stop
