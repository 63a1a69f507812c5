"""An EAGLE-style draft head and the drafter that runs it (docs/algorithms.md, "Draft head").

The head drafts from the target's own features. Row r of its sequence is the
token x_r together with the target's last hidden state (after the final norm)
of the token before it, f_{r-1} (zeros for r = 0):

    fc([embed(x_r); f_{r-1}])  ->  one decoder layer of the target's architecture
                                  (+ the final norm)  ->  f^_r  ->  LM head  ->  logits of x_{r+1}

The decoder layer is built from the target's own config class through
transformers (`AutoModel.from_config` with one layer), so it uses the same
attention, RoPE and KV-cache code as the target; the embedding and the LM head
are the target's, frozen and shared, never stored in the head's file.

Deeper tree nodes feed the head's own prediction f^ instead of a target
feature. After verification the drafter drops every row that used a predicted
feature and, at the next step, feeds the accepted tokens with the features the
target computed for them while verifying (`observe`), so the head's cache only
ever holds rows built from exact target features.

**Reduced draft vocabulary (FR-Spec).** The head may score only the K most
frequent tokens of its training answers (`vocab_ids`); every other token gets
logit -inf, i.e. draft probability 0. This is lossless: verification always
uses the target's full vocabulary; a sampled tree records the exact
(restricted) draft distribution it drew from, which the rejection verifiers
replay, and a selected tree is verified greedily or by sample-and-match, which
do not look at draft probabilities at all. Only the acceptance rate can change.

**Int8 draft logits (CPU).** `DraftHead.quantize_logits()` runs the draft-vocabulary
product with int8 weights and per-row activation scales (`engine/int8.int8_rows_linear`),
about a quarter of the float32 product's memory traffic. It is draft-side precision: the
draft distribution changes a little, the output distribution not at all (the verifiers
read the target's logits, and a sampled tree records the distribution it actually drew
from). `load_head(int8_logits=True)` turns it on; `int8_layers=True` (`quantize_layers`) runs `fc`
and the decoder layer's linears through the same kernel. Both are the default of CPU pairs
(`models.load_pair`, `--draft-logits auto`); docs/algorithms.md §6 has what they cost and change.

Files: `head.safetensors` (fc, the layer, the norm, `vocab_ids`) and
`head.json` (the target it belongs to, its vocabulary size, hidden size and an
embedding fingerprint); loading refuses a head made for another target.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, DynamicCache

from ..common.atomic import save_tensors_atomic
from ..common.hf_cache import cache_kwargs
from ..common.jsonfiles import write_json_atomic
from ..common.timing import clock
from ..engine.contracts import Drafter
from ..engine.int8 import int8_rows_linear, pack_int8_weight, swap_linears
from ..engine.placement import execution_device, materialised
from ..engine.tree import TokenTree, additive_mask
from ..errors import ArborError
from .head_batch import HeadBatchDrafter
from .head_traced import TracedHead
from .model import tree_rows_allowed

HEAD_FORMAT = "arborspec-draft-head"
HEAD_VERSION = 1
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "head.json"


def target_fingerprint(target_model) -> str:
    """A short hash of the target's input embedding (tells two targets with the same
    vocabulary apart)."""
    emb = materialised(target_model.get_input_embeddings())
    rows = emb[: min(64, emb.shape[0])].detach().to("cpu", torch.float16).contiguous()
    return hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]


def _one_layer_config(target_config):
    """The target's configuration cut to one decoder layer, the last, with full attention: the
    head attends over its whole draft context and its cache is compacted like the target's, which a
    sliding window's cache (transformers drops its old rows) would not allow."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        kind = cfg.layer_types[-1]
        cfg.layer_types = ["full_attention" if kind == "sliding_attention" else kind]
    if getattr(cfg, "sliding_window", None) is not None and not getattr(cfg, "layer_types", None):
        cfg.sliding_window = None  # every layer slides (Mistral): the head's one does not
    if getattr(cfg, "use_sliding_window", False):
        cfg.use_sliding_window = False
    cfg.use_cache = True
    return cfg


def _one_layer_body(target_config, dtype: torch.dtype):
    """The head's decoder (`_one_layer_config`) with sdpa attention, or eager where the
    architecture has no sdpa path (Gemma 2's soft-capped attention)."""
    cfg = _one_layer_config(target_config)
    try:
        return AutoModel.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    except ValueError:
        return AutoModel.from_config(cfg, attn_implementation="eager", dtype=dtype)


class DraftHead(nn.Module):
    """fc + one decoder layer + norm of the target's architecture; the target's embedding and LM
    head by reference."""

    def __init__(self, target_model, vocab_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        tcfg = target_model.config
        self.hidden_size = tcfg.hidden_size
        self.vocab_size = target_model.get_output_embeddings().weight.shape[0]
        self.body = _one_layer_body(tcfg, target_model.get_input_embeddings().weight.dtype)
        self.body.embed_tokens = None  # inputs are built by `fc`; the embedding is the target's
        self.fc = nn.Linear(2 * self.hidden_size, self.hidden_size, bias=False)
        ids = torch.arange(self.vocab_size) if vocab_ids is None else vocab_ids.long()
        self.register_buffer("vocab_ids", ids, persistent=True)
        self._target = (target_model.get_input_embeddings(), target_model.get_output_embeddings())
        self.int8_layers = False  # set by `quantize_layers`
        self.refresh_lm_rows()
        self.to(device=execution_device(target_model), dtype=self.body.norm.weight.dtype)

    # ------------------------------------------------------------------ construction
    def init_from_target(self, target_model) -> None:
        """Start from the target's last decoder layer and final norm (what the head imitates)."""
        tgt = target_model.get_decoder()
        self.body.layers[0].load_state_dict(tgt.layers[-1].state_dict())
        self.body.norm.load_state_dict(tgt.norm.state_dict())

    def refresh_lm_rows(self) -> None:
        """Copy the LM-head rows of the draft vocabulary (a [K, H] matrix: the
        head's cheap logits)."""
        lm, device = self._target[1], self.vocab_ids.device
        # an offloaded head's weights: from its hook
        weight, bias = materialised(lm), materialised(lm, "bias")
        ids = self.vocab_ids.to(weight.device)
        # derived from the target: non-persistent buffers (never saved, moved and cast with the
        # head)
        self.register_buffer(
            "lm_rows", weight.detach().index_select(0, ids).to(device), persistent=False
        )
        self.register_buffer(
            "lm_bias",
            None if bias is None else bias.detach().index_select(0, ids).to(device),
            persistent=False,
        )
        self.full_vocab = self.vocab_ids.numel() == self.vocab_size
        if getattr(self, "_int8_rows", None) is not None:  # int8 logits follow the new rows
            self._int8_rows = pack_int8_weight(self.lm_rows)
        else:
            self._int8_rows = None  # set by `quantize_logits`

    def quantize_logits(self) -> DraftHead:
        """Compute draft logits with int8 weights and per-row activation scales
        (CPU; module doc)."""
        if self.lm_rows.device.type != "cpu":
            raise ArborError(
                "int8 draft logits run on CPU only (fbgemm kernels): load the "
                "head without int8_logits"
            )
        self._int8_rows = pack_int8_weight(self.lm_rows)
        return self

    def quantize_layers(self) -> DraftHead:
        """Run `fc` and the decoder layer's linears with int8 weights and per-row activation scales,
        as the int8 target does (`engine/int8.swap_linears`, without its smoothing: draft-side
        precision changes the acceptance rate only). CPU only; a head so quantised drafts, but can
        no longer be trained or saved."""
        if self.vocab_ids.device.type != "cpu":
            raise ArborError(
                "an int8 draft head runs on CPU only (fbgemm kernels): load the head without int8"
            )
        swap_linears(self)
        self.int8_layers = True
        return self

    @property
    def int8_logits(self) -> bool:
        return self._int8_rows is not None

    # ------------------------------------------------------------------ forward
    def inputs(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """`tokens` [B, L], previous-token features `feats` [B, L, H] -> layer inputs [B, L, H]."""
        # its hook fetches an offloaded table
        emb = self._target[0](tokens.to(execution_device(self._target[0])))
        return self.fc(torch.cat([emb.to(feats.device, feats.dtype), feats], dim=-1))

    def forward(
        self, tokens, feats, position_ids=None, attention_mask=None, past_key_values=None
    ) -> torch.Tensor:
        """Predicted features f^ [B, L, H] (after the final norm)."""
        out = self.body(
            inputs_embeds=self.inputs(tokens, feats),
            attention_mask=attention_mask,
            position_ids=position_ids,
            **cache_kwargs(self.body, past_key_values),
            use_cache=past_key_values is not None,
        )
        return out.last_hidden_state

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary only: [..., K]."""
        if self._int8_rows is not None:
            return int8_rows_linear(hidden, self._int8_rows, self.lm_bias, self.lm_rows.shape[0])
        return nn.functional.linear(hidden, self.lm_rows, self.lm_bias)

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, V] float32 logits; tokens outside the draft vocabulary get -inf
        (draft probability 0)."""
        small = self.draft_logits(hidden).float()
        if self.full_vocab:
            return small
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        return out.index_copy_(1, self.vocab_ids, small)

    # ------------------------------------------------------------------ files
    def save(
        self,
        out_dir: str | Path,
        target_name: str,
        target_model,
        extra: dict | None = None,
        weights_dtype: torch.dtype | None = None,
    ) -> Path:
        """Write head.safetensors (floating weights in `weights_dtype`, default as
        trained) + head.json."""
        if self.int8_layers:
            raise ArborError(
                "this draft head runs int8 layers (loaded with int8): save the float "
                "head it was loaded from"
            )
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        if weights_dtype is not None:
            state = {
                k: v.to(weights_dtype) if v.is_floating_point() else v for k, v in state.items()
            }
        save_tensors_atomic(state, out / WEIGHTS_FILE, metadata={"format": HEAD_FORMAT})
        meta = {
            "format": HEAD_FORMAT,
            "version": HEAD_VERSION,
            "target": target_name,
            "target_model_type": target_model.config.model_type,
            "target_fingerprint": target_fingerprint(target_model),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "draft_vocab_size": int(self.vocab_ids.numel()),
            **(extra or {}),
        }
        write_json_atomic(meta, out / CONFIG_FILE, indent=2)
        return out


def read_head_config(head_dir: str | Path) -> dict:
    path = Path(head_dir) / CONFIG_FILE
    if not path.is_file() or not (Path(head_dir) / WEIGHTS_FILE).is_file():
        raise ArborError(
            f"{head_dir} is not a draft head directory ({CONFIG_FILE} + {WEIGHTS_FILE}): train one "
            "with `arborspec train-head`"
        )
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArborError(f"{path} is not valid JSON ({exc.msg}): re-export the head") from None
    if meta.get("format") != HEAD_FORMAT:
        raise ArborError(f"{path} is not an arborspec draft head config: re-export the head")
    return meta


def load_head(
    head_dir: str | Path,
    target_model,
    dtype: torch.dtype | None = None,
    int8_logits: bool = False,
    int8_layers: bool = False,
) -> DraftHead:
    """Load a head for `target_model`; a head made for another target or vocabulary is refused.
    `int8_logits`: draft logits with int8 weights; `int8_layers`: fc and the decoder layer in int8
    too (CPU; see the module doc)."""
    from safetensors.torch import load_file

    meta = read_head_config(head_dir)
    vocab = target_model.get_output_embeddings().weight.shape[0]
    if (
        meta.get("vocab_size") != vocab
        or meta.get("hidden_size") != target_model.config.hidden_size
    ):
        raise ArborError(
            f"draft head {head_dir} was trained for a target with vocabulary "
            f"{meta.get('vocab_size')} and hidden size {meta.get('hidden_size')}, this target has "
            f"{vocab} and {target_model.config.hidden_size}: train a head for this target with "
            "`arborspec train-head`"
        )
    if meta.get("target_fingerprint") != target_fingerprint(target_model):
        raise ArborError(
            f"draft head {head_dir} was trained for another target ({meta.get('target')!r}): "
            "train a head for this target with `arborspec train-head`"
        )
    state = load_file(str(Path(head_dir) / WEIGHTS_FILE))
    head = DraftHead(target_model, vocab_ids=state["vocab_ids"])
    head.load_state_dict(state)
    head.refresh_lm_rows()
    if dtype is not None:
        head.to(dtype=dtype)
    if int8_logits:
        head.quantize_logits()
    if int8_layers:
        head.quantize_layers()
    return head.eval().requires_grad_(False)


class HeadDrafter(Drafter):
    """Runs a `DraftHead` for the tree builders, fed by the target's features of
    the committed tokens.

    Head cache row r holds token x_r with feature f_{r-1}. `observe` receives
    target features in commit order; `begin` feeds every committed token whose
    previous feature is known (all of them: the engine's invariant is that the
    features of all committed tokens but the last are known) and answers the
    root's logits; `expand` feeds tree nodes depth by depth with the predicted
    feature of their parent; `commit` drops the draft rows.
    """

    uses_target_features = True

    def __init__(self, head: DraftHead, trace: bool | TracedHead | None = None) -> None:
        """`trace`: the head's forwards replayed from traces (drafters/head_traced.py); by default
        for a head whose layers run in int8 (CPU pairs), whose forward is mostly Python."""
        self.head = head
        self.vocab_size = head.vocab_size
        self.device = head.body.norm.weight.device
        self.dtype = head.body.norm.weight.dtype
        if trace is None:
            trace = head.int8_layers
        if trace is True:
            trace = TracedHead(head)
        self.traced = trace or None
        self.reset()

    def spawn(self) -> HeadDrafter:
        return HeadDrafter(self.head, trace=self.traced or False)  # the traces are shared

    def batched(self) -> HeadBatchDrafter:
        return HeadBatchDrafter(self.head, self.traced)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.head.body.config)
        self.feats: list[torch.Tensor] = []  # target features f_0, f_1, ... of committed tokens
        self.base = 0
        self.rows: dict[tuple[int, ...], int] = {}  # token path from the root -> head cache row
        # token path -> predicted feature of that node
        self.pred: dict[tuple[int, ...], torch.Tensor] = {}

    def observe(self, features: torch.Tensor) -> None:
        if features.numel():
            self.feats.extend(features.detach().to(self.device, self.dtype).unbind(0))

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def _rows(
        self,
        tokens: list[int],
        feats: torch.Tensor,
        positions: list[int],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        t0 = clock()
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device).view(1, -1)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device).view(1, -1)
        past = self.cache_len
        if mask is None and past:  # a causal chunk after the cache: its mask (a trace takes one,
            # and the eager forward gets the same, so both give the same rows)
            allowed = torch.ones(len(tokens), past + len(tokens), dtype=torch.bool).tril_(past)
            mask = additive_mask(allowed.to(self.device), self.dtype)[None, None]
        if self.traced is not None and self.traced.supports(self.cache):
            hidden = self.traced(ids, feats.unsqueeze(0), pos, mask, self.cache)[0]
        else:
            hidden = self.head(
                ids,
                feats.unsqueeze(0),
                position_ids=pos,
                attention_mask=mask,
                past_key_values=self.cache,
            )[0]
        self.forward_time += clock(self.device) - t0
        self.forwards += 1
        return hidden

    def begin(self, committed: list[int]) -> torch.Tensor:
        self.forward_time, self.forwards = 0.0, 0
        n = len(committed)
        if len(self.feats) < n - 1:
            raise RuntimeError(
                f"head drafter has {len(self.feats)} target features for {n} committed tokens"
            )
        start = self.cache_len
        zero = torch.zeros(self.head.hidden_size, device=self.device, dtype=self.dtype)
        prev = [self.feats[r - 1] if r > 0 else zero for r in range(start, n)]
        hidden = self._rows(committed[start:n], torch.stack(prev), list(range(start, n)), None)
        self.base = n
        root = hidden[-1]
        self.rows, self.pred = {(): n - 1}, {(): root}
        return self.head.full_logits(root.unsqueeze(0))[0]

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        past = self.cache_len
        allowed, paths = tree_rows_allowed(tree, nodes, self.base, past, self.rows)
        feats = [self.pred[path[:-1]] for path in paths]
        positions = [self.base - 1 + tree.depths[n] for n in nodes]
        mask = additive_mask(allowed.to(self.device), self.dtype)[None, None]
        hidden = self._rows([tree.tokens[n] for n in nodes], torch.stack(feats), positions, mask)
        for row, path in enumerate(paths):
            self.rows[path], self.pred[path] = past + row, hidden[row]
        return self.head.full_logits(hidden)

    def commit(self, tree: TokenTree, accepted: list[int]) -> None:
        drop = self.cache_len - self.base
        if drop > 0:
            self.cache.crop(-drop)
        self.rows, self.pred = {}, {}
