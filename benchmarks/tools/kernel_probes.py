"""The kernels a faster forward could use instead, timed one by one (docs/evaluation.md (h)).

    .venv/bin/python benchmarks/tools/kernel_probes.py --out benchmarks/results/kernel-probes.json

* float32 linears of the embedded target's shapes (576 x 1536, 1536 x 576) for 1-16 rows: MKL
  through `F.linear` (what the model runs), oneDNN with packed weights (`mkldnn_linear` on
  `weight.to_mkldnn()`, the input converted and the output converted back, as a drop-in would), and
  `x @ W^T` on a transposed copy of the weight;
* the int8 target's float64 attention (9 query heads, 3 key/value heads, head size 64, a cache of
  200 rows in a buffer with room for more, an additive mask) for 1-16 query rows: PyTorch's fused
  kernel as `engine/invariant_attention.py` calls it, and the same through two batched matrix
  products and a softmax; the largest difference between the two is recorded;
* the int8 target's per-row activation maximum max |x| (`engine/int8.py`) for 1-16 rows of 576 and
  1536 columns: `x.abs().amax(1)` (what the int8 product runs) and `linalg.vector_norm(x, inf, 1)`
  (the same values in one operator); the two are checked equal.

Each figure: microseconds per call, the median of `--rounds` rounds of `--calls` calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import machine_info, utc_timestamp, versions


def per_call_us(fn, calls: int, rounds: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return round(statistics.median(times) * 1e6, 1)


def linears(rows: list[int], calls: int, rounds: int) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for n_out, n_in in ((1536, 576), (576, 1536)):
        w = torch.randn(n_out, n_in, generator=gen) * 0.05
        packed, transposed = w.to_mkldnn(), w.t().contiguous()
        for n in rows:
            x = torch.randn(n, n_in, generator=gen)
            out.append(
                {
                    "shape": [n_out, n_in],
                    "rows": n,
                    "mkl_us": per_call_us(lambda: F.linear(x, w), calls, rounds),
                    "onednn_packed_us": per_call_us(
                        lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed).to_dense(),
                        calls,
                        rounds,
                    ),
                    "x_matmul_wt_us": per_call_us(lambda: x @ transposed, calls, rounds),
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def fused(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(
        q.double(), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )


def by_matmuls(q, k, v, mask, scale):
    b, heads, rows, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scores = torch.matmul(q.reshape(b, kv_heads, group * rows, dim).double(), k.transpose(-1, -2))
    scores = scores.view(b, kv_heads, group, rows, length).mul_(scale)
    scores.add_(mask.view(b, 1, 1, rows, length))
    probs = torch.softmax(scores, -1).view(b, kv_heads, group * rows, length)
    return torch.matmul(probs, v).view(b, heads, rows, dim)


def attention(rows: list[int], calls: int, rounds: int, context: int = 200) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for n in rows:
        length = context + n
        q = torch.randn(1, 9, n, 64, generator=gen)
        # views of longer buffers, as the float64 cache layer keeps them
        k = torch.randn(1, 3, 512, 64, generator=gen, dtype=torch.float64)[:, :, :length]
        v = torch.randn(1, 3, 512, 64, generator=gen, dtype=torch.float64)[:, :, :length]
        mask = torch.zeros(1, 1, n, length, dtype=torch.float64)
        mask[..., context:] = torch.full((n, n), -1e30, dtype=torch.float64).triu(1)
        diff = (fused(q, k, v, mask, 0.125) - by_matmuls(q, k, v, mask, 0.125)).abs().max()
        out.append(
            {
                "rows": n,
                "fused_us": per_call_us(lambda: fused(q, k, v, mask, 0.125), calls, rounds),
                "matmuls_us": per_call_us(lambda: by_matmuls(q, k, v, mask, 0.125), calls, rounds),
                "max_difference": float(diff),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def row_maxima(rows: list[int], calls: int, rounds: int) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for cols in (576, 1536):
        for n in rows:
            x = torch.randn(n, cols, generator=gen)
            if not torch.equal(
                x.abs().amax(1, True), torch.linalg.vector_norm(x, float("inf"), 1, True)
            ):
                raise AssertionError("the two row maxima differ")
            out.append(
                {
                    "columns": cols,
                    "rows": n,
                    "abs_amax_us": per_call_us(lambda: x.abs().amax(1, True), calls, rounds),
                    "vector_norm_inf_us": per_call_us(
                        lambda: torch.linalg.vector_norm(x, float("inf"), 1, True), calls, rounds
                    ),
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/kernel-probes.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    result = {
        "linears_float32": linears(rows, args.calls, args.rounds),
        "attention_float64": attention(rows, args.calls, args.rounds),
        "row_maxima": row_maxima(rows, args.calls * 10, args.rounds),
        "threads": args.threads,
        "machine": machine_info(),
        "versions": versions(),
        "timestamp": utc_timestamp(),
    }
    write_json_atomic(result, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
