"""llama.cpp's plain decoding as a peer in `arborspec bench`: what a CPU user would run instead.

`arborspec bench --compare-llama-cpp` times llama.cpp (through the `llama-cpp-python` bindings,
installed in the benchmark's environment, not a dependency of arborspec) on the same prompts, in
the same process and interleaved with arborspec's plain and speculative decoding, and records its
runs under the label `llama.cpp` like any other method: tokens counted the same way (new tokens
up to EOS or `max_new_tokens`), the wall time from before the prompt's prefill to the last token,
so the report's tokens/s and its ratio to plain decoding sit side by side with the others'.

llama.cpp runs the GGUF file itself: for the embedded target that is the Q4_1 file arborspec
dequantises to float32 (and quantises again for its int8 target), so llama.cpp computes with
4-bit weights and 8-bit activations, a different model numerically from either arborspec target:
its tokens are not compared with plain decoding's (docs/evaluation.md).

Prompts are fed as the same token ids arborspec decodes (the GGUF's vocabulary is the one the
converted tokenizer was made from; a GGUF with another vocabulary size is refused). Every
generation starts from an empty KV cache: the bindings would otherwise reuse the longest common
prefix of the previous generation's tokens and skip part of the prefill.
"""

from __future__ import annotations

from pathlib import Path

from ..common.timing import clock
from ..errors import ArborError

LLAMA_CPP = "llama.cpp"  # the label of its runs in results files and reports
PIP = 'pip install "llama-cpp-python==0.3.36"'  # builds llama.cpp from source: ~10 min on 2 cores


class LlamaCppPeer:
    """One GGUF loaded by llama.cpp; `generate` runs plain decoding from a list of token ids."""

    def __init__(self, gguf: str | Path, threads: int, context: int, vocab_size: int) -> None:
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ArborError(
                f"--compare-llama-cpp needs llama-cpp-python in this environment: {PIP}"
            ) from None
        path = Path(gguf)
        if not path.is_file():
            raise ArborError(f"GGUF file {str(path)!r} does not exist: check --gguf")
        self.path = path
        self.threads = threads
        try:
            self.llm = Llama(
                model_path=str(path),
                n_ctx=context,
                n_batch=512,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ArborError(f"llama.cpp cannot load {path.name} ({exc}): check --gguf") from None
        if self.llm.n_vocab() != vocab_size:
            raise ArborError(
                f"{path.name} has {self.llm.n_vocab()} tokens, the target {vocab_size}: give "
                "--gguf the GGUF file of the benchmarked target"
            )

    def describe(self) -> str:
        return f"{LLAMA_CPP} plain decoding of {self.path.name} ({self.threads} threads)"

    def generate(
        self,
        ids: list[int],
        max_new_tokens: int,
        eos: list[int],
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
    ) -> tuple[list[int], float, str]:
        """(new token ids, wall seconds, stop reason "eos" or "length"): greedy at temperature 0,
        else sampled with llama.cpp's own sampler (its top-k / top-p; no min-p, no penalty)."""
        out: list[int] = []
        stop = "length"
        t0 = clock()
        self.llm.reset()  # an empty cache: no prefix kept from the previous generation
        self.llm.set_seed(seed)
        tokens = self.llm.generate(
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
