"""An int8 target for CPU whose tree verification stays exact (docs/algorithms.md §8).

Int8 is a *different target*: its logits differ from the float32 model's (its quality is
measured and reported next to its speed: docs/evaluation.md (c)). What must not happen is
that a token's logits depend on the other tokens of its forward, or tree verification would
no longer reproduce plain decoding of the same int8 model. Off-the-shelf dynamic quantisation
(one activation scale per *tensor*) breaks exactly that. This module builds a path that keeps it:

* `Int8Linear`: weights int8 per output channel, activations quantised **per row** (each token
  with its own scale, computed from that row alone), products accumulated in integers by
  fbgemm. Integer sums are exact, so a row's result does not depend on its neighbours. The
  weights use 7 bits (+-63): the AVX2 kernel adds pairs of u8 x s8 products in int16, and
  255 x 63 x 2 < 2^15 cannot saturate (with 8-bit weights it can, and then the one-row and
  many-row kernels round differently).
* SmoothQuant (Xiao et al. 2023) before quantising: per input channel, a scale
  `s = max|x|^a / max|w|^(1-a)` moves activation outliers into the weights; it is folded into
  the preceding RMSNorm (q/k/v, gate/up), into `up_proj` (down_proj) and into `v_proj`
  (o_proj), so the float model is unchanged up to rounding (checked on the calibration text).
* Attention in float64 (`engine/invariant_attention.py`): the one float32 reduction left whose
  rounding depends on the number of query rows.

The LM head stays float32 (engine/lm_head.py runs it one row at a time, as for float32 models):
the target's logits decide the output, and no option quantises the head (docs/algorithms.md §8).

Where the CPU has AMX int8 tiles, products of `ONEDNN_MIN_ROWS` rows or more (prefills, batched
forwards) run through oneDNN's int8 linear instead (`torch.ops.onednn`, what inductor's x86 int8
path calls): the same 8-bit inputs, the same exact integer sums and the same float32 scaling as
fbgemm's kernel, so every output is bit for bit fbgemm's (tests), at a cost that grows more slowly
with the rows but is higher for a few; below that many rows fbgemm is faster (docs/algorithms.md
§8).

fbgemm's kernels are reached through `torch.ops.quantized` (the quantised-tensor API that PyTorch
has deprecated): torchao's CPU int8 configurations were either slower than float32 here
(weight-only) or quantise activations per tensor, which is not batch-invariant
(docs/algorithms.md §8).
"""

from __future__ import annotations

import copy
import warnings
from functools import cache

import torch
import torch.nn as nn

from ..common.provenance import cpu_flags
from ..errors import ArborError
from .invariant_attention import use_float64_attention

WEIGHT_LEVELS = 63  # 7-bit weights: no int16 saturation in the AVX2 kernel
ACT_LEVELS = 127  # 8-bit activations, symmetric around zero point 128
ACT_ZERO = 128
# The kernel takes the scaled row x as unsigned 8-bit values round(x + 128) in float32, so an
# activation's 8-bit value is round(x + 128) - 128: round(x) except where adding 128 rounds x onto
# a half-way point (about one element in 10^5). `rounded_like_kernel` gives those values.
SMOOTH_ALPHA = 0.5
_FOLD_TOLERANCE = 1e-3  # relative logit change allowed when folding the smoothing scales


def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """Per output channel, the int8 weight scale max|w| / 63 (float64, as fbgemm's
    packed weight keeps it)."""
    return (weight.detach().float().cpu().abs().amax(1) / WEIGHT_LEVELS).clamp_min(1e-12).double()


def pack_int8_weight(weight: torch.Tensor):
    """fbgemm's packed int8 weight: per output channel, scale max|w| / 63."""
    w = weight.detach().float().cpu()
    scale = weight_scales(w)
    with warnings.catch_warnings():  # the quantised-tensor API is deprecated (module doc)
        warnings.simplefilter("ignore")
        qw = torch.quantize_per_channel(
            w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8
        )
        return torch.ops.quantized.linear_prepack(qw, None)


# the operator's one overload, resolved once, and its C++ entry point where PyTorch exposes it: the
# packet's call and the overload's each check every argument for Python dispatch first (~2 us each,
# 120 products per forward)
_Q_DQ_LINEAR = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default
_Q_DQ_LINEAR = getattr(_Q_DQ_LINEAR, "_op", _Q_DQ_LINEAR)


def packed_int8_values(packed) -> torch.Tensor:
    """The int8 values `[out, in]` of a packed weight, as the kernel multiplies them."""
    with warnings.catch_warnings():  # the quantised-tensor API is deprecated (module doc)
        warnings.simplefilter("ignore")
        return torch.ops.quantized.linear_unpack(packed)[0].int_repr()


# from this many rows on, a product runs through oneDNN's int8 linear where the CPU has AMX (module
# doc; docs/algorithms.md §8)
ONEDNN_MIN_ROWS = 48


@cache
def amx_int8() -> bool:
    """Whether this CPU has AMX int8 tiles and this PyTorch build oneDNN's int8 linear."""
    return hasattr(torch.ops.onednn, "qlinear_pointwise") and "amx_int8" in cpu_flags()


def onednn_rows(rows: int) -> bool:
    """Whether products of a forward of `rows` rows may run through oneDNN (module doc)."""
    return rows >= ONEDNN_MIN_ROWS and amx_int8()


class OneDnnWeight(nn.Module):
    """oneDNN's packed copy of an fbgemm int8 weight: the same int8 values and per-channel scales
    (module doc). Its tensors are buffers, so a trace of the decoder (engine/traced.py) records
    them; oneDNN's packed tensor cannot be copied, so a deep copy packs its own from the copied
    fbgemm weight."""

    def __init__(self, packed) -> None:
        super().__init__()
        self.packed = packed
        values = packed_int8_values(packed)
        with warnings.catch_warnings():  # the quantised-tensor API is deprecated (module doc)
            warnings.simplefilter("ignore")
            scales = torch.ops.quantized.linear_unpack(packed)[0].q_per_channel_scales()
        weight = torch.ops.onednn.qlinear_prepack(values, None)
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("scales", scales.float(), persistent=False)
        self.register_buffer("zeros", torch.zeros(len(values), dtype=torch.long), persistent=False)

    @classmethod
    def of(cls, packed) -> OneDnnWeight | None:
        """The copy where `amx_int8()`, else None (fbgemm runs every product)."""
        return cls(packed) if amx_int8() else None

    def __deepcopy__(self, memo: dict) -> OneDnnWeight:
        return OneDnnWeight(copy.deepcopy(self.packed, memo))


@cache
def _product_by_rows():
    """fbgemm's product (`_Q_DQ_LINEAR` at scale 1, zero point `zero`), through oneDNN from
    `min_rows` rows on: the inputs rounded to the same unsigned 8-bit values round(x + zero), the
    same integer sums and scaling. A TorchScript function, so that inside a trace
    (engine/traced.py), where one trace replays forwards of any number of rows, the choice is made
    at each replay."""

    def product(
        scaled: torch.Tensor,
        packed: torch.classes.quantized.LinearPackedParamsBase,
        weight: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        zero: int,
        min_rows: int,
    ) -> torch.Tensor:
        if scaled.shape[0] >= min_rows:
            values = scaled.add(zero).round_().to(torch.uint8)
            no_post_op: list[int | float | complex | None] = []
            return torch.ops.onednn.qlinear_pointwise(
                values, 1.0, zero, weight, scales, zeros, None, 1.0, 0,
                torch.float32, "none", no_post_op, "",
            )  # fmt: skip
        return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            scaled, 1.0, zero, packed
        )

    return torch.jit.script(product)


def int8_rows_product(
    rows: torch.Tensor, packed, onednn: OneDnnWeight | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 `rows [N, in]`, each quantised with its own scale max|x| / 127 -> (`rows W^T` with
    integer sums `[N, out]`, the scaled rows the kernel rounded to 8 bits `[N, in]`,
    the scales `[N, 1]`). `onednn`: the weight's oneDNN copy, used from `ONEDNN_MIN_ROWS` rows on
    (the same values bit for bit)."""
    # max |x| per row. Not `linalg.vector_norm(ord=inf)`: the same values, but its kernel is not
    # vectorised across rows
    scale = rows.abs().amax(1, keepdim=True).clamp_min_(1e-30).div_(ACT_LEVELS)
    scaled = rows / scale
    # A trace of a forward with rows enough for oneDNN records the choice itself
    # (`_product_by_rows`: the rows of a packed batch vary from replay to replay); one of
    # fewer rows (a separate trace, engine/traced.py), like an eager call below the threshold,
    # calls fbgemm's entry point directly (no call of the choice per product in a replay).
    many = onednn is not None and onednn_rows(rows.shape[0])
    if many and (torch.jit.is_tracing() or rows.shape[0] >= ONEDNN_MIN_ROWS):
        y = _product_by_rows()(
            scaled, packed, onednn.weight, onednn.scales, onednn.zeros, ACT_ZERO, ONEDNN_MIN_ROWS
        )
    else:
        y = _Q_DQ_LINEAR(scaled, 1.0, ACT_ZERO, packed)
    return y.mul_(scale), scaled, scale


def rounded_like_kernel(scaled: torch.Tensor) -> torch.Tensor:
    """The 8-bit values (as float32) the int8 product uses for float32 rows in units of their
    scales (`int8_rows_product`'s second result)."""
    return scaled.add(ACT_ZERO).round_().sub_(ACT_ZERO)


def int8_rows_linear(
    x: torch.Tensor,
    packed,
    bias: torch.Tensor | None,
    out_features: int,
    onednn: OneDnnWeight | None = None,
) -> torch.Tensor:
    """`x [..., in]` -> `[..., out]`: each row quantised with its own scale, products
    summed in integers (`onednn`: as for `int8_rows_product`)."""
    rows = x.reshape(-1, x.shape[-1]).float()
    y = int8_rows_product(rows, packed, onednn)[0]
    if bias is not None:
        y.add_(bias)
    return y.view(*x.shape[:-1], out_features).to(x.dtype)


class Int8Linear(nn.Module):
    """`y = x W^T + b` with int8 per-channel weights and per-row 8-bit
    activations; exact per row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self._packed = pack_int8_weight(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float().cpu()
        self.register_buffer("bias", bias, persistent=False)
        self.onednn = OneDnnWeight.of(self._packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_rows_linear(x, self._packed, self.bias, self.out_features, self.onednn)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, w7a8 per-row"


class Int8Group:
    """Several linears that read the same input (q/k/v, gate/up) as one int8 product
    over their stacked rows.

    The decoder calls them one after the other on the same tensor; the first call computes every
    member's output, the others take their slice. Per output element the arithmetic is the one
    of a separate `Int8Linear` (per-channel weight scales, the same per-row activation scale).
    """

    def __init__(self, linears: list[nn.Linear]) -> None:
        weight = torch.cat([lin.weight.detach() for lin in linears])
        biases = [lin.bias for lin in linears]
        self.bias = (
            None
            if all(b is None for b in biases)
            else torch.cat(
                [
                    b.detach().float() if b is not None else torch.zeros(lin.out_features)
                    for b, lin in zip(biases, linears)
                ]
            ).cpu()
        )
        self.packed = pack_int8_weight(weight)
        self.onednn = OneDnnWeight.of(self.packed)
        self.out_features = weight.shape[0]
        self.last_input: torch.Tensor | None = None
        self.last_output: torch.Tensor | None = None
        self.served: set[int] = set()
        edges = [0]
        for lin in linears:
            edges.append(edges[-1] + lin.out_features)
        self.members = [
            Int8GroupMember(self, i, a, b, lin.in_features)
            for i, (a, b, lin) in enumerate(zip(edges, edges[1:], linears))
        ]

    def output_for(self, x: torch.Tensor, member: int) -> torch.Tensor:
        """The group's output for `x`; computed on the first member's call, released
        after the last one's."""
        # `is` on a held reference: never a reused tensor
        if x is not self.last_input or member in self.served:
            self.last_output = int8_rows_linear(
                x, self.packed, self.bias, self.out_features, self.onednn
            )
            self.last_input, self.served = x, set()
        out = self.last_output
        self.served.add(member)
        if len(self.served) == len(self.members):  # every member has its slice: hold no activations
            self.last_input = self.last_output = None
        return out


class Int8GroupMember(nn.Module):
    """One linear of an `Int8Group` (its slice of the group's output)."""

    def __init__(
        self, group: Int8Group, index: int, start: int, end: int, in_features: int
    ) -> None:
        super().__init__()
        self.group, self.index, self.start, self.end = group, index, start, end
        self.in_features, self.out_features = in_features, end - start
        # the group's packed weight as an attribute of a module: a trace of the decoder
        # (engine/traced.py) finds the weights it records among its modules' attributes
        self._packed = group.packed
        # the group's oneDNN copy as a submodule of one member: a trace records its buffers
        self.onednn = group.onednn if index == 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output_for(x, self.index)[..., self.start : self.end]

    def extra_repr(self) -> str:
        return f"rows {self.start}:{self.end} of a shared int8 product"


def _layers(model) -> list[nn.Module]:
    layers = getattr(model.get_decoder(), "layers", None)
    names = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    )
    if layers is None:
        raise ArborError(
            f"int8 supports Llama-style decoders; {type(model).__name__} has no "
            "`layers`: use --dtype float32"
        )
    for layer in layers:
        try:
            for n in names:
                layer.get_submodule(n)
        except AttributeError:
            raise ArborError(
                f"int8 supports Llama-style decoder layers (q/k/v/o, gate/up/down, two norms); "
                f"{type(layer).__name__} differs: use --dtype float32"
            ) from None
    return list(layers)


@torch.no_grad()
def activation_maxima(model, samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per input channel, the largest |activation| each `nn.Linear` of the decoder
    sees on `samples`."""
    maxima: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, args):
            seen = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
            maxima[name] = seen if name not in maxima else torch.maximum(maxima[name], seen)

        return hook

    hooks = [
        m.register_forward_pre_hook(keep(n))
        for n, m in model.get_decoder().named_modules()
        if isinstance(m, nn.Linear)
    ]
    try:
        for ids in samples:
            model(input_ids=ids.view(1, -1))
    finally:
        for h in hooks:
            h.remove()
    return maxima


def _smoothing(act_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    return (act_max.clamp_min(1e-5) ** alpha / w_max.clamp_min(1e-5) ** (1 - alpha)).clamp_min(1e-5)


@torch.no_grad()
def smooth(model, maxima: dict[str, torch.Tensor], alpha: float = SMOOTH_ALPHA) -> None:
    """Fold SmoothQuant scales into the weights (module doc); the float model's
    function is unchanged."""
    cfg = model.config
    heads, kv_heads = (
        cfg.num_attention_heads,
        getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
    )
    for i, layer in enumerate(_layers(model)):
        attn, mlp = layer.self_attn, layer.mlp
        prefix = f"layers.{i}."
        for norm, lins, key in (
            (layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj), "self_attn.q_proj"),
            (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj), "mlp.gate_proj"),
        ):
            s = _smoothing(maxima[prefix + key], [lin.weight for lin in lins], alpha)
            norm.weight.div_(s)
            for lin in lins:
                lin.weight.mul_(s)
        s = _smoothing(maxima[prefix + "mlp.down_proj"], [mlp.down_proj.weight], alpha)
        mlp.up_proj.weight.div_(s[:, None])
        if mlp.up_proj.bias is not None:
            mlp.up_proj.bias.div_(s)
        mlp.down_proj.weight.mul_(s)
        # o_proj reads the attention output; channel (head h, dim d) is linear in v
        # channel (h // group, d)
        head_dim = attn.o_proj.in_features // heads
        s = _smoothing(maxima[prefix + "self_attn.o_proj"], [attn.o_proj.weight], alpha)
        # one scale per v channel, shared by its heads
        s = s.view(kv_heads, heads // kv_heads, head_dim).amax(1)
        attn.v_proj.weight.div_(s.reshape(-1)[:, None])
        if attn.v_proj.bias is not None:
            attn.v_proj.bias.div_(s.reshape(-1))
        attn.o_proj.weight.mul_(
            s[:, None, :].expand(kv_heads, heads // kv_heads, head_dim).reshape(-1)
        )


GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def swap_linears(root: nn.Module) -> None:
    """Every `nn.Linear` under `root` -> int8 (`Int8Linear`); in each decoder layer the linears that
    share an input (q/k/v, gate/up) run as one `Int8Group`."""
    for module in list(root.modules()):
        for parent_name, names in GROUPS:
            parent = getattr(module, parent_name, None)
            if isinstance(parent, nn.Module) and all(
                type(getattr(parent, n, None)) is nn.Linear for n in names
            ):
                group = Int8Group([getattr(parent, n) for n in names])
                for name, member in zip(names, group.members):
                    setattr(parent, name, member)
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child))


@torch.no_grad()
def quantize_int8(model, samples: list[torch.Tensor], alpha: float = SMOOTH_ALPHA):
    """Turn a float32 CPU causal LM into the batch-invariant int8 target, in place; returns it.

    `samples`: token-id tensors of calibration text (activation ranges for the smoothing).
    """
    if next(model.parameters()).device.type != "cpu":
        raise ArborError(
            "--dtype int8 runs on CPU only (fbgemm kernels): use --device cpu, or "
            "float16/bfloat16 on a GPU"
        )
    if next(model.parameters()).dtype != torch.float32:
        raise ArborError("int8 quantises a float32 model: load it with dtype float32 first")
    reference = model(input_ids=samples[0].view(1, -1)).logits[0]
    smooth(model, activation_maxima(model, samples), alpha)
    folded = model(input_ids=samples[0].view(1, -1)).logits[0]
    if (folded - reference).abs().max() > _FOLD_TOLERANCE * reference.abs().max():
        raise ArborError(
            f"int8: {type(model).__name__}'s norms do not absorb the smoothing scales "
            "(not a Llama-style RMSNorm): use --dtype float32"
        )
    swap_linears(model.get_decoder())
    use_float64_attention(model)
    return model
