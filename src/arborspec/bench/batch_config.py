"""What the concurrency benchmark (`arborspec bench-batch`, bench/batch_runner.py) runs: its
settings (`ConcurrencyConfig`), its methods and the option lists of the command.

Methods. Every run of a (temperature, concurrency, arrival, repeat) runs plain batched decoding
(`plain`: every request's root alone in the batch's forward, no drafter) and each method on the same
requests. A method is a builder spec as `bench` takes it (`dyspec:budget=3:lookup=6`: that builder
for every request, context lookup per request) or
`shared:max_nodes=8[:max_depth=D][:budget=B|auto]:lookup=6`: DySpec trees of every request grown
from one heap (builders/shared_budget.py), at most `max_nodes` per request, `budget` draft nodes
per step for the whole batch (auto, the default: sized by the batch's measured costs). With
`sequential`, plain decoding one request after another (`plain-sequential`,
`engine.decode.autoregressive_generate`) also runs in the concurrency-1 burst cells: the ratio of
plain batched to one-after-another throughput.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..builders import make_builder
from ..builders.shared_budget import SharedBudget
from ..engine.contracts import TreeBuilder
from ..engine.sampling import SamplingConfig
from ..errors import ArborError
from ..models import head_int8
from .run import MethodConfig, parse_method_spec

BENCHMARK = "concurrency"  # the header's `benchmark`: what `arborspec report` tells apart
PLAIN = "plain"  # plain batched decoding: every run's baseline
SEQUENTIAL = "plain-sequential"  # plain decoding one request after another (concurrency 1)
SHARED = "shared"  # DySpec trees of the whole batch from one heap (builders/shared_budget.py)
SHARED_KEYS = ("max_nodes", "max_depth", "budget", "lookup")
ARRIVALS = ("burst", "staggered")


@dataclass(kw_only=True)
class ConcurrencyConfig:
    target: str = "embedded"
    draft: str | None = None  # None = the target's default draft
    draft_logits: str = "auto"
    methods: list[str] = field(default_factory=lambda: ["dyspec:budget=3:lookup=6"])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    prompts: str = "mt-bench"
    num_prompts: int | None = 16
    max_new_tokens: int = 128
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    arrivals: list[str] = field(default_factory=lambda: ["burst", "staggered"])
    repeats: int = 1
    warmup: int = 1  # untimed warm-up runs per method (two requests of WARMUP_TOKENS each)
    sequential: bool = False  # also plain decoding one request after another, concurrency 1
    device: str = "cpu"
    dtype: str = "float32"
    out_dir: Path = Path("runs/bench-batch")
    resume: bool = False
    chat: bool = True
    top_k: int = 0
    top_p: float = 1.0
    draft_temperature: float | None = None
    threads: int | None = None
    compile: bool = False

    def validate(self) -> None:
        if not self.concurrency or any(
            not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in self.concurrency
        ):
            raise ArborError(f"concurrency must be whole numbers >= 1, got {self.concurrency}")
        bad = [a for a in self.arrivals if a not in ARRIVALS]
        if not self.arrivals or bad:
            raise ArborError(
                f"arrival must be {' or '.join(ARRIVALS)}, got {bad[0] if bad else 'nothing'!r}"
            )
        if self.sequential and (1 not in self.concurrency or "burst" not in self.arrivals):
            raise ArborError(
                "--sequential times plain decoding one request after another in the concurrency-1 "
                "burst runs: include 1 in --concurrency and burst in --arrival"
            )
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ArborError(f"temperatures must be >= 0 (0 = greedy), got {self.temperatures}")
        for name, value in (("max_new_tokens", self.max_new_tokens), ("repeats", self.repeats)):
            if value < 1:
                raise ArborError(f"{name} must be >= 1, got {value}")
        if self.warmup < 0:
            raise ArborError(f"warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ArborError(f"threads must be >= 1, got {self.threads}")
        head_int8(self.draft_logits, self.device, False)
        SamplingConfig(max(self.temperatures), self.top_k, self.top_p, self.draft_temperature)

    def to_json(self) -> dict:
        d = asdict(self)
        d["out_dir"] = str(self.out_dir)
        return d


@dataclass(frozen=True)
class BatchMethod:
    """One method of the concurrency benchmark: a builder spec point, or the shared budget."""

    spec: MethodConfig

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def lookup(self) -> int:
        return self.spec.lookup

    def shared(self) -> SharedBudget | None:
        """The shared budget of a `shared:` method (None for a per-request builder)."""
        if self.name != SHARED:
            return None
        params = dict(self.spec.params)
        unknown = sorted(set(params) - set(SHARED_KEYS))
        if unknown:
            raise ArborError(
                f"method {self.label!r} has no parameter {unknown[0]!r}: {SHARED} takes "
                f"{', '.join(SHARED_KEYS)}"
            )
        if isinstance(params.get("budget"), str) and params["budget"].lower() == "auto":
            params["budget"] = None
        for key in ("max_nodes", "max_depth", "budget"):
            value = params.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ArborError(
                    f"method {self.label!r}: {key} must be a whole number >= 1"
                    + (" or auto" if key == "budget" else "")
                    + f", got {value!r}"
                )
        return SharedBudget(
            max_nodes=params.get("max_nodes", 16),
            max_depth=params.get("max_depth"),
            budget=params.get("budget"),
        )

    def make(self) -> TreeBuilder:
        """The builder every request of this method gets (for `shared`: DySpec up to its
        per-request cap, which the shared budget grows)."""
        shared = self.shared()
        if shared is not None:
            return make_builder("dyspec", budget=shared.max_nodes)
        return self.spec.make()


def expand_batch_methods(specs: list[str]) -> list[BatchMethod]:
    """Parse every spec (bench/run.parse_method_spec) and build each builder once, so a bad value
    fails before any model loads."""
    out: list[BatchMethod] = []
    for spec in specs:
        for point in parse_method_spec(spec):
            method = BatchMethod(point)
            if method.label in (PLAIN, SEQUENTIAL):
                raise ArborError(f"{method.label!r} always runs: give only tree methods with -m")
            method.make(), method.lookup  # one-line ArborErrors
            if method not in out:
                out.append(method)
    return out


def parse_concurrency(text: str) -> list[int]:
    """`--concurrency "1,2,4"` -> [1, 2, 4] (ascending, each once); one-line error otherwise."""
    items = [v for v in text.replace(" ", "").split(",") if v]
    if not items or not all(v.isdecimal() and v.isascii() and int(v) >= 1 for v in items):
        raise ArborError(
            "--concurrency must be a comma list of whole numbers >= 1, e.g. 1,2,4,8,16; "
            f"got {text!r}"
        )
    return sorted({int(v) for v in items})


def parse_arrivals(text: str) -> list[str]:
    """`--arrival "burst,staggered"` -> in ARRIVALS order, each once; one-line error otherwise."""
    items = [v.strip().lower() for v in text.split(",") if v.strip()]
    bad = [v for v in items if v not in ARRIVALS]
    if not items or bad:
        raise ArborError(
            f"--arrival must be a comma list of {', '.join(ARRIVALS)}; got {text!r}"
        )
    return [a for a in ARRIVALS if a in items]
