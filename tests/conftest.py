"""Shared fixtures and helpers: tiny randomly initialised Llama pairs (seconds on CPU), a draft head
trained on a tiny target, `TableDrafter` (the one test double for a drafter whose
distributions come from a table), the `device` a test runs on (`on_device` copies a model there),
`wait_until` (polling for a state instead of sleeping), the greedy-identity check
(`assert_greedy_identical`, `same_tokens`) and the chi-square test every sampled-distribution test
uses (`assert_follows`, `assert_departs`)."""

from __future__ import annotations

import copy
import math
import os
import random
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.contracts import DraftContext, Drafter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig, probs_from_logits
from arborspec.engine.tree import TokenTree

# Tiny test models gain nothing from threads, and parallel threads fight over 2 cores.
torch.set_num_threads(1)

# The real models use both cores when the tests run in one process. Under pytest-xdist the workers
# share the cores: one thread per worker, and per process a test starts (OMP_NUM_THREADS), since
# more threads than cores make every forward wait on the others (a test then runs several times
# slower than alone).
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
MODEL_THREADS = 1 if XDIST_WORKERS > 1 else 2
if XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# --------------------------------------------------------------------------- devices and waiting
# "cpu" always; "cuda" where a CUDA GPU is visible (skipped otherwise). A test that takes `device` runs
# its CPU checks there too; `pytest -m cuda` runs every check meant for a GPU (tests/test_cuda.py too).
DEVICES = (
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[
        pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")]),
)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """The device the test runs on (`DEVICES`)."""
    return request.param


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def on_device(model, device: str):
    """`model` itself on a CPU; on another device a copy of it there (made once per model and device), so
    the shared fixtures stay on the CPU."""
    if torch.device(device).type == "cpu":
        return model
    copies = _COPIES.setdefault(model, {})
    if device not in copies:
        copies[device] = copy.deepcopy(model).to(device)
    return copies[device]


def wait_until(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str],
               every: float = 0.05):
    """Call `predicate` every `every` seconds until it returns something true, and return that; fail after
    `timeout` seconds saying what was awaited (`what`, or what it returns: a message made at the failure).
    An assertion inside `predicate` fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"waited {timeout:g} s for {what() if callable(what) else what}", pytrace=False)
        time.sleep(every)


def tiny_llama(seed: int, vocab: int = 96, hidden: int = 48, layers: int = 2, init: float = 0.3, max_pos: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
        initializer_range=init, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).eval()
    return model


def char_tokenizer():
    """A character-level tokenizer for the tiny models' 96 tokens (no chat template), to save beside them."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 124)]  # 92 printable characters + 4 specials = the tiny models' 96 tokens
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")


class TableDrafter(Drafter):
    """A drafter whose next-token distribution after each token path is `table(path)` (`[V]` probabilities).

    Counts draft forwards (`expand` calls) and the rows they asked for.
    """

    def __init__(self, table: Callable[[tuple[int, ...]], torch.Tensor], vocab_size: int) -> None:
        self.table, self.vocab_size = table, vocab_size
        self.forwards, self.rows = 0, 0

    def dist(self, path: tuple[int, ...]) -> torch.Tensor:  # [V]
        return self.table(tuple(path))

    def begin(self, committed: list[int]) -> torch.Tensor:
        return self.dist(()).log()

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:  # [K, V]
        self.forwards += 1
        self.rows += len(nodes)
        return torch.stack([self.dist(tuple(tree.path_tokens(n))).log() for n in nodes])


def random_table(vocab: int, seed: int, power: float = 3.0, zero_share: float = 0.0,
                 bump: float = 0.0) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """A fixed pseudo-random distribution per token path: `rand ** power`, a `zero_share` of exact
    zeros, and `bump` added to one random token (so no distribution is all zeros)."""

    def table(path: tuple[int, ...]) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash((seed, *path)) & (2**62 - 1))
        w = torch.rand(vocab, generator=gen) ** power
        if zero_share:
            w[torch.rand(vocab, generator=gen) < zero_share] = 0.0
        if bump:
            w[int(torch.randint(vocab, (1,), generator=gen))] += bump
        return w / w.sum()

    return table


def table_ctx(drafter: Drafter, seed: int = 0, temperature: float = 1.0) -> DraftContext:
    """The draft side of one step rooted after token 0, with a seeded generator."""
    return DraftContext(drafter, SamplingConfig(temperature=temperature), torch.Generator().manual_seed(seed),
                        drafter.begin([0]))


def perturbed_copy(model, seed: int, noise: float):
    """A draft that agrees with the target often but not always."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=gen))
    return draft


@pytest.fixture(scope="session")
def tiny_pair():
    target = tiny_llama(0)
    draft = perturbed_copy(target, 1, 0.3)
    return target, draft


@pytest.fixture(scope="session")
def small_vocab_pair():
    """A 16-token target and a perturbed copy as draft: small enough for exact distributions (Monte-Carlo tests)."""
    target = tiny_llama(5, vocab=16, hidden=32, init=0.4)
    return target, perturbed_copy(target, 6, 0.5)


@pytest.fixture(scope="session")
def head_target():
    """The tiny target a draft head is trained on (`tiny_pair`'s target weights, an object of its own)."""
    return tiny_llama(0, layers=2)


def make_head(target, vocab_ids=None, seed=0):
    """An untrained draft head for `target`, started from the target's last layer."""
    from arborspec.drafters.head import DraftHead

    torch.manual_seed(seed)
    head = DraftHead(target, vocab_ids=vocab_ids)
    head.init_from_target(target)
    return head.eval().requires_grad_(False)


@torch.no_grad()
def greedy_sequences(target, n_seqs, prompt_len=6, new=40, seed=0):
    """Target-greedy continuations of random prompts, with the target's features (what head_data stores)."""
    from arborspec.offline.head_data import HeadSequence

    rng = random.Random(seed)
    vocab = target.config.vocab_size
    out = []
    for _ in range(n_seqs):
        ids = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        seq = target.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=None, attention_mask=torch.ones(1, prompt_len, dtype=torch.long))[0]
        feats = target.model(input_ids=seq[None]).last_hidden_state[0]
        out.append(HeadSequence(seq, feats[:-1].half(), prompt_len))
    return out


@pytest.fixture(scope="session")
def trained_head(head_target, tmp_path_factory):
    """A head trained briefly on the tiny target's own greedy text (restricted to 64 of 96 tokens):
    (head, training record, the untrained head's scores, the sequences, the config, the work folder).

    A random tiny Llama's text has no structure to generalise from, so the head
    is evaluated on its training sequences: what is checked is that training
    and inference are wired right (a head that memorised the target's text must
    make the trees accept it), not how well it generalises.
    """
    from arborspec.offline.train_head import HeadTrainConfig, evaluate, train

    target = head_target
    seqs = greedy_sequences(target, 16)
    work = tmp_path_factory.mktemp("head")
    cfg = HeadTrainConfig(out=str(work / "out"), work_dir=str(work / "w"), draft_vocab=64, epochs=40, lr=3e-3,
                          warmup_steps=5, batch_tokens=256, ttt_steps=2, ckpt_every=10_000)
    target.requires_grad_(False)
    before = evaluate(make_head(target, vocab_ids=torch.arange(64)), seqs, cfg)
    head, info = train(cfg, target, seqs, seqs, progress=False)
    return head.eval().requires_grad_(False), info, before, seqs, cfg, work


# --------------------------------------------------------------------------- greedy identity
# the second repeats itself (lookup has something to copy); the last has nothing to prefill
GREEDY_PROMPTS = ([5, 17, 33, 8, 9, 40], [1, 60, 61, 62, 60, 61, 62, 60, 61], [88])
EOS = (2,)
_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# |tree row - plain row| allowed, times max(1, the row's largest |logit|): float32 leaves summation
# order; float16 and bfloat16 round every activation (8 and 11 mantissa bits: a few units in the
# last place after two layers). Sibling paths differ by far more (tests/test_cuda.py checks it).
TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}


def tolerance(dtype: str, ref: torch.Tensor) -> float:
    return TOL[dtype] * max(1.0, float(ref.abs().max()))


def on_gpu(model) -> bool:
    return next(model.parameters()).device.type == "cuda"


def input_ids(model, ids: list[int]) -> torch.Tensor:
    """`[ids]` where `model` takes its input: its GPU, or the CPU (offloaded models included)."""
    return torch.tensor([list(ids)], device=next(model.parameters()).device if on_gpu(model) else "cpu")


def row_logits(model, ids: list[int]) -> torch.Tensor:
    """The model's own next-token logits after `ids` (one plain forward), float32 on the CPU."""
    with torch.no_grad():
        return model(input_ids(model, ids)).logits[0, -1].float().cpu()


def same_tokens(model, prompt: list[int], got: list[int], want: list[int], what: str = "",
                ties: bool = True) -> bool:
    """Assert that `got` = `want`, two greedy continuations of `prompt` by `model`; False when they are
    identical. One exception, with `ties` and a model in float16 or bfloat16: they may part at a rounding
    tie, a token where the plain forward's logits of the two tokens lie within the dtype's tolerance (`TOL`;
    on a GPU a tree forward and a one-row forward are different kernels and round differently, which
    decides an exact or near tie either way). Then it warns, saying where, and returns True; the tests
    bound how many generations may end at a tie, so an identity is still checked. Anything else fails,
    with both tokens' logits."""
    if list(got) == list(want):
        return False
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    if i >= min(len(got), len(want)):
        raise AssertionError(f"{what}: lengths differ ({len(got)} vs {len(want)}) after {i} equal tokens")
    row = row_logits(model, list(prompt) + list(want[:i]))
    top = torch.topk(row, 2)
    gap = float(row[want[i]] - row[got[i]])
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    where = (f"token {i}: {got[i]} (logit {row[got[i]]:.5f}) instead of {want[i]} (logit "
             f"{row[want[i]]:.5f}); top-2 gap of the plain row {float(top.values[0] - top.values[1]):.5f}")
    if ties and dtype in ("float16", "bfloat16") and abs(gap) <= tolerance(dtype, row):
        warnings.warn(f"{what}: left the reference at a {dtype} rounding tie, {where}", stacklevel=2)
        return True
    raise AssertionError(f"{what}: {where}")


def greedy_reference(target, prompt, max_new_tokens: int = 24, eos=EOS, pad: int = 0) -> list[int]:
    """Plain greedy decoding of `prompt` through the adapter, asserted equal to HF `generate` of the same
    model (both stop at `eos`; on a GPU they may part at a half-precision rounding tie, `same_tokens`);
    computed once per model, prompt and length."""
    cache = _REFERENCES.setdefault(target, {})
    key = (tuple(prompt), max_new_tokens, tuple(eos))
    if key not in cache:
        cfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos))
        plain = autoregressive_generate(ModelAdapter(target), list(prompt), cfg).output_ids
        ids = input_ids(target, prompt)
        with torch.no_grad():
            hf = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=list(eos), pad_token_id=pad)
        same_tokens(target, prompt, plain, hf[0, len(prompt):].tolist(),
                    f"plain decoding vs HF generate on {list(prompt)}", ties=on_gpu(target))
        cache[key] = plain
    return list(cache[key])


def assert_greedy_identical(target, drafter, builder, prompts=GREEDY_PROMPTS, max_new_tokens: int = 24, *,
                            eos=EOS, pad: int = 0, cost=None, lookup: int = 0, helped: bool = True):
    """Greedy speculative output == plain decoding == HF `generate`, prompt by prompt, with every committed
    token accounted to a step; `helped`: some step accepted a draft token (the trees were not empty).
    On a CPU the outputs are identical in every precision; on a GPU a half-precision generation may part at
    a rounding tie (`same_tokens`), and not every prompt's may. `drafter`: a `Drafter`, or a model to draft
    with. Returns the speculative results."""
    if isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter)
    dec = SpeculativeDecoder(ModelAdapter(target), drafter, builder, cost=cost, lookup=lookup)
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos))
    results, tied = [], 0
    for prompt in prompts:
        spec = dec.generate(list(prompt), cfg)
        want = greedy_reference(target, prompt, max_new_tokens, eos, pad)
        what = f"{getattr(builder, 'name', builder)} lookup {lookup} on {list(prompt)}"
        tied += same_tokens(target, prompt, spec.output_ids, want, what, ties=on_gpu(target))
        assert sum(s.accepted_length for s in spec.steps) == len(spec.output_ids)
        results.append(spec)
    assert tied < len(prompts), f"every generation ends at a rounding tie ({tied})"
    if helped:
        assert max(s.accepted_length for r in results for s in r.steps) > 1, "no draft token accepted"
    return results


# --------------------------------------------------------------------------- sampled distributions
# The distribution tests compare sampled frequencies with an exact law by Pearson's chi-square test at
# this false-alarm rate: with a correct implementation, a check's fixed seeds fail it with probability at
# most FALSE_ALARM (split evenly, Bonferroni, where a test makes several checks). The suite makes about 80
# such checks: together they false-alarm with probability under 1 %.
FALSE_ALARM = 1e-4
MIN_EXPECTED = 5.0  # cells expected fewer times are pooled, so the chi-square approximation holds


@dataclass(frozen=True)
class Fit:
    """Pearson's chi-square of `n` samples against a law: statistic, degrees of freedom, p-value."""

    n: int
    statistic: float
    df: int
    p: float

    def __str__(self) -> str:
        return f"chi-square {self.statistic:.1f} on {self.df} df, p = {self.p:.2e}, n = {self.n}"


def chi2_sf(statistic: float, df: int) -> float:
    """P(X >= statistic) for X chi-square with `df` degrees of freedom (the regularised upper gamma)."""
    if statistic == float("inf"):
        return 0.0
    a, x = torch.tensor(df / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(a, x))


def _cells(probs: torch.Tensor, n: float) -> list[list[int]]:
    """The outcomes of `probs` (flat, float64, summing to 1) grouped into the cells Pearson's test compares:
    each outcome expected at least MIN_EXPECTED times in `n` samples alone, the rest pooled (into the smallest
    such cell if even pooled they are expected fewer times)."""
    expected = n * probs
    big = [[i] for i in torch.nonzero(expected >= MIN_EXPECTED).flatten().tolist()]
    rest = torch.nonzero((expected < MIN_EXPECTED) & (probs > 0)).flatten().tolist()
    if rest:
        if float(expected[rest].sum()) >= MIN_EXPECTED or not big:
            big.append(rest)
        else:
            min(big, key=lambda cell: float(expected[cell].sum())).extend(rest)
    return big


def goodness_of_fit(counts, probs) -> Fit:
    """Pearson's test of observed `counts` (any shape) against the law `probs` (same shape), on `_cells`; a
    sample of an outcome of probability 0 gives p = 0."""
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    probs = probs / probs.sum()
    n = int(counts.sum())
    if bool((counts[probs <= 0] > 0).any()):
        return Fit(n, float("inf"), 0, 0.0)
    cells = _cells(probs, n)
    df = len(cells) - 1
    if df < 1:
        return Fit(n, 0.0, 0, 1.0)
    statistic = sum((float(counts[c].sum()) - n * float(probs[c].sum())) ** 2 / (n * float(probs[c].sum()))
                    for c in cells)
    return Fit(n, statistic, df, chi2_sf(statistic, df))


def chi2_isf(alpha: float, df: int) -> float:
    """The critical value c with P(X >= c) = alpha, X chi-square with `df` degrees of freedom (bisection)."""
    lo, hi = 0.0, df + 100.0
    while chi2_sf(hi, df) > alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return hi


def power(n: int, probs, alternative, alpha: float = FALSE_ALARM) -> float:
    """The probability that Pearson's test at rate `alpha` rejects `probs` given `n` samples drawn from
    `alternative`: the noncentral chi-square tail (a Poisson mixture of central ones) with noncentrality
    n * sum over the cells of (alternative - probs)^2 / probs."""
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    probs = probs / probs.sum()
    alternative = torch.as_tensor(alternative, dtype=torch.float64).flatten()
    alternative = alternative / alternative.sum()
    cells = _cells(probs, n)
    df = len(cells) - 1
    lam = n * sum((float(alternative[c].sum()) - float(probs[c].sum())) ** 2 / float(probs[c].sum())
                  for c in cells)
    critical = chi2_isf(alpha, df)
    terms = int(lam / 2 + 12 * math.sqrt(lam / 2 + 1) + 50)
    weights = torch.distributions.Poisson(torch.tensor(lam / 2, dtype=torch.float64)).log_prob(
        torch.arange(terms, dtype=torch.float64)).exp()
    tails = torch.special.gammaincc(torch.arange(terms, dtype=torch.float64) + df / 2,
                                    torch.tensor(critical / 2, dtype=torch.float64))
    return float((weights * tails).sum())


def shifted(probs, tv: float) -> torch.Tensor:
    """`probs` with `tv` of its mass moved from the likeliest outcome to the second likeliest: a law at total
    variation `tv` from it, shifted between the largest cells, where a chi-square test sees a shift least."""
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    probs = probs / probs.sum()
    first, second = torch.topk(probs, 2).indices.tolist()
    assert probs[first] >= tv, "the likeliest outcome has less mass than the shift"
    out = probs.clone()
    out[first] -= tv
    out[second] += tv
    return out


MIN_POWER = 0.9  # what a test that states the deviation it detects must reach against it


def assert_follows(counts, probs, alpha: float = FALSE_ALARM, what: str = "",
                   detects: float | None = None) -> Fit:
    """The sampled `counts` are consistent with the law `probs` at false-alarm rate `alpha`.

    `detects`: the power the test states: with as many samples, the same test rejects `shifted(probs,
    detects)`, a law `detects` away in total variation, with probability at least MIN_POWER (`power`)."""
    fit = goodness_of_fit(counts, probs)
    assert fit.p >= alpha, f"{what} does not follow the law: {fit} < {alpha}".strip()
    if detects is not None:
        seen = power(fit.n, probs, shifted(probs, detects), alpha)
        assert seen >= MIN_POWER, f"{what}: {fit.n} samples see a law {detects} away with probability {seen:.3f}"
    return fit


def assert_departs(counts, probs, alpha: float = FALSE_ALARM, what: str = "") -> Fit:
    """Negative control: the same test rejects `counts` as samples of `probs` (it has the power to)."""
    fit = goodness_of_fit(counts, probs)
    assert fit.p < alpha, f"{what} was not told apart from the law: {fit} >= {alpha}".strip()
    return fit


def exact_first_two(target, prompt, cfg):
    """Exact law of the first generated token and the marginal law of the second."""
    with torch.no_grad():
        p1 = probs_from_logits(target(torch.tensor([prompt])).logits[0, -1], cfg)
        rows = torch.stack([target(torch.tensor([prompt + [t]])).logits[0, -1]
                            for t in range(target.config.vocab_size)])
    p2 = p1 @ probs_from_logits(rows, cfg)
    return p1, p2


def first_two_counts(dec, prompt, cfg, runs):
    """Counts of the first and of the second sampled token over seeds 0 .. runs - 1."""
    vocab = dec.target.model.config.vocab_size
    c1, c2 = torch.zeros(vocab), torch.zeros(vocab)
    for seed in range(runs):
        out = dec.generate(prompt, DecodeConfig(max_new_tokens=2, sampling=cfg, seed=seed)).output_ids
        c1[out[0]] += 1
        c2[out[1]] += 1
    return c1, c2


def assert_first_two_follow(dec, target, prompt, cfg, runs, what: str = "", detects: float | None = 0.1):
    """The first two sampled tokens over `runs` seeds follow the target's exact laws (FALSE_ALARM split over
    the two), and the samples tell apart laws `detects` away (`assert_follows`); returns the counts and laws."""
    p1, p2 = exact_first_two(target, prompt, cfg)
    c1, c2 = first_two_counts(dec, prompt, cfg, runs)
    assert_follows(c1, p1, FALSE_ALARM / 2, f"{what} first token", detects)
    assert_follows(c2, p2, FALSE_ALARM / 2, f"{what} second token", detects)
    return (c1, c2), (p1, p2)
