"""A thin adapter over an *unmodified* Hugging Face causal LM: prefill, tree
forwards, KV compaction.

Tree attention needs no forked modelling code (docs/algorithms.md §4,
with its traps): we pass a 4D additive mask `[1, 1, N, P + N]` in the
model dtype, explicit `position_ids` (`P + depth`), and a `DynamicCache`.
After verification the accepted path is copied into place in every layer and
the rest is cropped (O(path length), no re-feeding).

Models with sliding-window layers (Gemma 2 and 3, Mistral, Qwen2 with a window) keep full cache
layers too; every forward then passes explicit masks, the window cut out of them by position, one
per layer type (engine/attention_masks.py), and the adapter keeps the position of every cache row.
A layer type no mask expresses (chunked or linear attention, recurrent state) is refused when the
adapter is built.

Models loaded with a device map (layers on several devices, offloaded to the CPU
or the disk: engine/placement.py) work unchanged: inputs go to the model's
execution device, each cache layer is compacted on its own device, and an
LM head under accelerate's hooks is left to the model's own forward (engine/lm_head.py).
"""

from __future__ import annotations

import torch

from ..common.hf_cache import cache_kwargs
from ..errors import ArborError
from .attention_masks import AttentionLayout
from .kv_cache import CACHE_LAYERS, new_cache, uses_float64_attention
from .lm_head import HeadRows, LazyLogits
from .placement import execution_device
from .traced import TracedDecoder
from .tree import TokenTree


def decoder_hidden(output) -> torch.Tensor:
    """`[B, N, H]` last hidden states (after the final norm) from a decoder's forward output
    (tuple or ModelOutput)."""
    return output[0] if isinstance(output, tuple) else output.last_hidden_state


class ModelAdapter:
    """Owns one model and its KV cache for one sequence (batch size 1)."""

    def __init__(self, model, trace: bool | None = None) -> None:
        self.model = model
        self.config = model.config
        # layer types and sliding window; ArborError for a layer type no mask expresses
        self.layout = AttentionLayout.of(model)
        self.dtype = next(model.parameters()).dtype
        # not model.device: `meta` when the first weights are offloaded
        self.device = execution_device(model)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        # model -> an empty cache (engine/kv_cache.py); benchmarks may swap it
        self.new_cache = new_cache
        self.cache = new_cache(model)
        # sliding windows only: the position of every cache row, `[cache_len]` long
        self.positions = self._no_positions()
        self.last_hidden: torch.Tensor | None = None  # [N, H] of the last forward, when capturing
        self._hook = None
        # logits from hidden rows (engine/lm_head.py); else the model's own logits
        self.head = HeadRows(model)
        # small forwards replayed from traces (engine/traced.py); by default where their results
        # are the eager ones bit for bit and the eager path is mostly overhead: the int8 target
        if trace is None:
            trace = uses_float64_attention(model) and self.device.type == "cpu"
        self.traced = TracedDecoder(model) if trace else None

    # ------------------------------------------------------------------ features
    def capture_hidden(self, on: bool = True) -> None:
        """Keep the decoder's last hidden states (after the final norm) of every
        forward in `last_hidden`.

        A forward hook on the model's decoder reads what the model computes anyway:
        no second LM-head pass and no `output_hidden_states` over every layer.
        """
        if on and self._hook is None:
            self._hook = self.model.get_decoder().register_forward_hook(self._keep_hidden)
        elif not on and self._hook is not None:
            self._hook.remove()
            self._hook, self.last_hidden = None, None

    @property
    def capturing(self) -> bool:
        return self._hook is not None

    def _keep_hidden(self, module, args, output) -> None:
        self.last_hidden = decoder_hidden(output)[0]

    # ------------------------------------------------------------------ compilation
    def compile(self) -> None:
        """Run the model's decoder through `torch.compile` (dynamic shapes) from now on: the same
        modules and weights, fewer Python operations per forward. The first forwards of each kind
        (one row, several rows) pay the compilation; a one-off of tens of seconds to minutes on a
        CPU, so it is a choice (`--compile`, docs/algorithms.md §7). Everything that runs the
        model, plain decoding and `transformers` `generate` included, then runs the compiled
        decoder, so comparisons stay like for like."""
        decoder = self.model.get_decoder()
        if not getattr(decoder, "_arborspec_compiled", False):
            decoder.forward = torch.compile(decoder.forward, dynamic=True)
            decoder._arborspec_compiled = True

    @property
    def compiled(self) -> bool:
        return bool(getattr(self.model.get_decoder(), "_arborspec_compiled", False))

    # ------------------------------------------------------------------ state
    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = self.new_cache(self.model)
        self.positions = self._no_positions()

    def _no_positions(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ forwards
    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [N]
        position_ids: torch.Tensor | None = None,  # [1, N]
        allowed: torch.Tensor | None = None,  # [N, P + N] bool: who attends to whom; None: causal
        logits_rows: torch.Tensor | None = None,  # [K] rows to run the LM head on (None = all)
    ) -> torch.Tensor:  # [K, V] float32
        if self.head.supported:
            hidden = self.hidden_forward(input_ids, position_ids, allowed)
            return self.head.logits(
                hidden if logits_rows is None else hidden[logits_rows.to(self.device)]
            )
        keep = 0 if logits_rows is None else logits_rows.to(self.device)
        inputs = self._inputs(input_ids, position_ids, allowed)
        out = self.model(
            **inputs, **cache_kwargs(self.model, self.cache), use_cache=True, logits_to_keep=keep
        )
        self._fed(inputs["position_ids"])
        return out.logits[0].float()

    @torch.inference_mode()
    def hidden_forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        allowed: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [N, H]
        """The decoder alone (no LM head): last hidden states of the fed tokens, cache extended."""
        inputs = self._inputs(input_ids, position_ids, allowed)
        hidden = self.decoder_forward(**inputs, cache=self.cache)[0]
        self._fed(inputs["position_ids"])
        return hidden

    def decoder_forward(
        self,
        input_ids: torch.Tensor,  # [B, N]
        position_ids: torch.Tensor,  # [B, N]
        attention_mask,
        cache,
    ) -> torch.Tensor:  # [B, N, H]
        """The decoder's last hidden states for a forward after `cache` (extended): replayed from a
        trace where one applies (engine/traced.py), else the modules' own forward."""
        decoder = self.model.get_decoder()
        if (
            self.traced is not None
            and not self.compiled
            and self.traced.supports(cache, input_ids, attention_mask)
        ):
            hidden = self.traced(input_ids, position_ids, attention_mask, cache)
            if self._hook is not None:  # the decoder's forward hook does not run in a replay
                self.last_hidden = hidden[0]
            return hidden
        out = decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **cache_kwargs(decoder, cache),
            use_cache=True,
        )
        return decoder_hidden(out)

    @torch.inference_mode()
    def features_along(self, input_ids: list[int]) -> torch.Tensor:  # [len(input_ids), H]
        """The last hidden states (after the final norm) of every token of a finished sequence, from
        one forward of the decoder that leaves the cache alone: what a drafter with
        `uses_target_features` reads (`observe`), for the offline tools that run a drafter along a
        sequence instead of inside the step loop. A model with sliding-window layers gets explicit
        masks here too: transformers builds none for an attention it does not know (the int8
        target's float64 attention), which would then attend causally past the window."""
        decoder = self.model.get_decoder()
        ids = torch.tensor([input_ids], device=self.device)
        mask = None
        if self.layout.sliding:
            positions = torch.arange(ids.shape[1], device=self.device)
            mask = self.layout.mask(None, positions, positions, self.dtype)
        out = decoder(input_ids=ids, attention_mask=mask, use_cache=False)
        return decoder_hidden(out)[0]

    def _inputs(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        allowed: torch.Tensor | None,
    ) -> dict:
        """`input_ids`, `position_ids` (default: right after the cache) and `attention_mask` (one
        mask or a dict by layer type, engine/attention_masks.py) for a forward after the cache."""
        ids = input_ids.to(self.device).view(1, -1)
        past = self.cache_len
        if position_ids is None:
            position_ids = torch.arange(past, past + ids.shape[1], device=self.device).unsqueeze(0)
        position_ids = position_ids.to(self.device)
        keys = None
        if self.layout.sliding:
            if self.positions.numel() != past:
                raise RuntimeError(
                    f"{self.positions.numel()} row positions kept for a cache of {past} rows"
                )
            keys = torch.cat([self.positions, position_ids[0]])
        mask = self.layout.mask(
            None if allowed is None else allowed.to(self.device), position_ids[0], keys, self.dtype
        )
        return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}

    def _fed(self, position_ids: torch.Tensor) -> None:
        """After a forward: check the cache's layers, keep the new rows' positions."""
        self._check_cache_layout()
        if self.layout.sliding:
            self.positions = torch.cat([self.positions, position_ids[0]])

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed a plain (causal) chunk after the cache; return the last row's logits `[V]`."""
        return self.feed(input_ids)[0]

    def feed(self, input_ids: torch.Tensor) -> torch.Tensor | LazyLogits:
        """Feed a plain chunk after the cache; the last row's logits on demand (`LazyLogits` of
        one row: nothing computed unless read, its greedy token screened), or `[1, V]` logits where
        the model's head does not allow it."""
        if self.head.supported:
            return LazyLogits(self.hidden_forward(input_ids)[-1:], self.head)
        return self.forward(input_ids, logits_rows=torch.tensor([input_ids.numel() - 1]))

    def tree_forward(
        self, tree: TokenTree, lazy: bool = False
    ) -> torch.Tensor | LazyLogits:  # [N, V]
        """Feed every tree node (root first) with tree attention; return logits for all nodes.

        `lazy`: return `LazyLogits`, whose rows are computed when the verifier reads them
        (only the rows on its walk); plain tensor logits where the model's head does not allow it.
        """
        past = self.cache_len
        # every cached row, the node's ancestors and itself (TokenTree.attention_mask)
        n = tree.num_nodes
        allowed = torch.ones(n, past + n, dtype=torch.bool, device=self.device)
        allowed[:, past:] = tree.ancestors_mask().to(self.device)
        ids = torch.tensor(tree.tokens, dtype=torch.long)
        positions = tree.position_ids(past, self.device)
        if lazy and self.head.supported:
            return LazyLogits(self.hidden_forward(ids, positions, allowed), self.head)
        return self.forward(ids, positions, allowed)

    def nodes_forward(
        self,
        tokens: list[int],
        positions: list[int],
        allowed: torch.Tensor,  # [K, P + K] bool over (cache + these K tokens)
        logits_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Feed K tokens with an arbitrary attention pattern (the draft's
        depth-by-depth tree forward)."""
        pos = torch.tensor(positions, dtype=torch.long, device=self.device).unsqueeze(0)
        return self.forward(torch.tensor(tokens, dtype=torch.long), pos, allowed, logits_rows)

    # ------------------------------------------------------------------ compaction
    @torch.inference_mode()
    def compact(self, start: int, slots: list[int]) -> None:
        """Keep cache rows `slots` (ascending, all >= start) at `start, start+1, ...`;
        drop everything after.

        Rows before `start` are untouched. This is the O(k) copy + crop of the notes.
        """
        keep_len = start + len(slots)
        moved = bool(slots) and slots != list(range(start, keep_len))
        if moved:
            for layer in self.cache.layers:
                src = torch.tensor(slots, device=layer.keys.device)
                layer.keys[:, :, start:keep_len] = layer.keys.index_select(2, src)
                layer.values[:, :, start:keep_len] = layer.values.index_select(2, src)
        if moved and self.layout.sliding:
            src = torch.tensor(slots, device=self.positions.device)
            self.positions[start:keep_len] = self.positions.index_select(0, src)
        self.crop_to(keep_len)

    def crop_to(self, length: int) -> None:
        drop = self.cache_len - length
        if drop > 0:
            self.cache.crop(-drop)
        if self.layout.sliding:
            self.positions = self.positions[: self.cache_len]

    def _check_cache_layout(self) -> None:
        """Every cache layer one a compaction can copy rows of (a full layer: `CACHE_LAYERS`)."""
        layers = self.cache.layers
        other = sorted({type(la).__name__ for la in layers if type(la) not in CACHE_LAYERS})
        if other:
            raise ArborError(
                f"{type(self.model).__name__} keeps {', '.join(other)} KV cache layers, which "
                "arborspec cannot compact: it supports full and sliding-window attention layers"
            )
