"""C2T, offline half: training data and training of the pruning classifier (Huo et al. 2025,
"C2T", Sec. 4.1, App. B).

The classifier, its three features and its file format are the online half's
(`builders/c2t_classifier.py`); this module only writes classifier files.

Training data: at real positions of target-written continuations of training
prompts (the built-in instruction list of `offline/prompts.py` or a user file —
not the MT-Bench / HumanEval evaluation sets), the draft grows a large
EAGLE-style tree (every frontier node proposes its top-k children; the k with
the largest joint probability across the layer form the next frontier; `depth`
layers), and ONE target tree forward labels every node: a node is positive when
the verifier of selected trees accepts it (greedy at temperature 0, else
sample-and-match: the target's choice at its parent is the node's token and the
parent is accepted). Positives are rare, so each epoch keeps every positive and
samples `neg_per_pos` negatives per positive (BCE, Adam).

Metrics on held-out trees: recall, positive rate and precision at the
threshold `beta`, and the recall of the joint-probability-only rule that
keeps the same number of nodes (the EAGLE-2 style baseline C2T improves on).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..builders.base import top_children
from ..builders.c2t_classifier import (
    DEFAULT_CLASSIFIER,
    C2TClassifier,
    c2t_features,
    make_classifier,
    save_classifier,
)
from ..common.chat import encode_prompt, eos_ids
from ..common.progress import progress_enumerate
from ..common.provenance import machine_info, utc_timestamp
from ..engine.adapter import ModelAdapter
from ..engine.contracts import DraftContext, Drafter
from ..engine.decode import DecodeConfig, autoregressive_generate
from ..engine.placement import execution_device
from ..engine.sampling import SamplingConfig
from ..engine.tree import TokenTree
from ..engine.verifiers import greedy, sample_match
from ..errors import ArborError
from ..models import load_pair
from .prompts import read_prompts


# ---------------------------------------------------------------------------- training data
@dataclass(kw_only=True)
class C2TConfig:
    k: int = 8  # children per node and frontier width per layer of the expanded trees
    depth: int = 6  # layers of the expanded trees
    num_prompts: int = 24
    max_new_tokens: int = 48  # continuation the target writes per prompt
    positions_per_prompt: int = 8  # trees per prompt, spread over prompt end + continuation
    temperature: float = 0.0  # target sampling for continuations and labels (0 = greedy labels)
    top_p: float = 1.0
    neg_per_pos: int = 4  # negatives sampled per positive, each epoch
    epochs: int = 40
    lr: float = 3e-3
    batch_size: int = 1024
    holdout: float = 0.2  # share of trees held out for the metrics
    beta: float = 0.5  # confidence threshold the metrics are reported at
    seed: int = 0

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, 0, self.top_p)


@dataclass
class C2TDataset:
    features: torch.Tensor  # [N, 3]
    labels: torch.Tensor  # [N] float 0/1
    tree_ids: torch.Tensor  # [N] which tree each node came from
    source: dict = field(default_factory=dict)

    @property
    def num_trees(self) -> int:
        return int(self.tree_ids.max()) + 1 if self.tree_ids.numel() else 0


def expanded_tree(
    ctx: DraftContext, root_token: int, k: int, depth: int
) -> tuple[TokenTree, torch.Tensor]:
    """EAGLE-2 style expansion; returns the tree and the features `[N-1, 3]` of nodes 1..N-1."""
    tree = TokenTree.from_root(root_token, "selected")
    feats, frontier = [], [0]
    for _ in range(depth):
        cands = top_children(ctx, tree, frontier, k)
        if not cands.parents:
            break
        features = c2t_features(cands)  # [C, 3]
        # node value = the joint-probability feature
        added = cands.add(tree, values=features[:, 0].tolist())
        feats.append(features)
        best = features[:, 0].topk(min(k, len(added))).indices.tolist()
        frontier = [added[i] for i in best]
    return tree, torch.cat(feats) if feats else torch.zeros(0, 3)


def label_tree(
    tree: TokenTree,
    target_logits: torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # [N, V] -> [N] bool
    """True for the root and the nodes the verifier of selected trees accepts (greedy at temperature
    0, else sample-and-match): the path along which the target's own choices follow the tree."""
    verify = greedy if cfg.greedy else sample_match
    accepted = torch.zeros(tree.num_nodes, dtype=torch.bool)
    accepted[[0] + verify(tree, target_logits, cfg, generator).accepted] = True
    return accepted


def tree_positions(prompt_len: int, total_len: int, count: int) -> list[int]:
    """`count` root positions spread evenly from the prompt's last token to the
    second-last token."""
    first, last = prompt_len - 1, total_len - 2
    if last <= first or count <= 1:
        return [first]
    return sorted({first + round(i * (last - first) / (count - 1)) for i in range(count)})


def collect_training_data(
    target_model,
    drafter: Drafter,
    prompts: list[list[int]],
    cfg: C2TConfig,
    eos_token_ids: tuple[int, ...] = (),
    progress: bool = True,
) -> C2TDataset:
    """Expanded draft trees at real positions, labelled by one target tree forward each."""
    target = ModelAdapter(target_model)
    sampling = cfg.sampling
    gen = torch.Generator().manual_seed(cfg.seed)
    feats, labels, ids_of_tree = [], [], []
    for i, prompt in progress_enumerate(prompts, "C2T trees", progress):
        dcfg = DecodeConfig(
            max_new_tokens=cfg.max_new_tokens,
            sampling=sampling,
            seed=cfg.seed + i,
            eos_token_ids=eos_token_ids,
        )
        out = autoregressive_generate(target, list(prompt), dcfg).output_ids
        ids = list(prompt) + out
        target.reset()
        drafter.reset()
        # the draft head: the target's features of the whole sequence first
        drafter.observe_sequence(target, ids)
        for pos in tree_positions(len(prompt), len(ids), cfg.positions_per_prompt):
            if pos > target.cache_len:
                # everything before the root
                target.prefill(torch.tensor(ids[target.cache_len : pos]))
            ctx = DraftContext(drafter, sampling.draft_side(), gen, drafter.begin(ids[: pos + 1]))
            tree, tree_feats = expanded_tree(ctx, ids[pos], cfg.k, cfg.depth)
            drafter.commit(tree, [])  # drop the draft's expansion rows
            logits = target.tree_forward(tree).cpu()  # [N, V]
            target.crop_to(pos)
            feats.append(tree_feats)
            labels.append(label_tree(tree, logits, sampling, gen)[1:].float())
            ids_of_tree.append(torch.full((tree.size,), len(ids_of_tree), dtype=torch.long))
    if not feats:
        raise ArborError("no training trees were collected: give at least one prompt")
    return C2TDataset(torch.cat(feats), torch.cat(labels), torch.cat(ids_of_tree))


# ---------------------------------------------------------------------------- training
def split_trees(data: C2TDataset, holdout: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks `[N]` (train, held-out) splitting by whole trees."""
    n = data.num_trees
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    held = perm[: max(1, round(holdout * n))] if n > 1 else perm[:0]
    is_held = torch.zeros(n, dtype=torch.bool)
    is_held[held] = True
    mask = is_held[data.tree_ids]
    return ~mask, mask


def evaluate(
    confidence: torch.Tensor, joint: torch.Tensor, labels: torch.Tensor, beta: float
) -> dict:
    """Recall / positive rate / precision at `beta`, and joint-probability recall at the
    same positive rate."""
    pred = confidence >= beta
    pos = labels > 0.5
    kept = int(pred.sum())
    recall = float((pred & pos).sum()) / max(int(pos.sum()), 1)
    baseline = torch.zeros_like(pred)
    if kept:
        baseline[joint.topk(kept).indices] = True
    return {
        "beta": beta,
        "nodes": int(labels.numel()),
        "positives": int(pos.sum()),
        "recall": recall,
        "positive_rate": kept / max(labels.numel(), 1),
        "precision": float((pred & pos).sum()) / max(kept, 1),
        "joint_probability_recall": float((baseline & pos).sum()) / max(int(pos.sum()), 1),
    }


def train(data: C2TDataset, cfg: C2TConfig, progress: bool = False) -> tuple[C2TClassifier, dict]:
    """Fit the classifier with negative sampling; metrics on held-out trees (or on the
    training set if one tree)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    train_mask, held_mask = split_trees(data, cfg.holdout, cfg.seed)
    x, y = data.features[train_mask], data.labels[train_mask]
    pos, neg = (y > 0.5).nonzero().squeeze(-1), (y < 0.5).nonzero().squeeze(-1)
    if pos.numel() == 0 or neg.numel() == 0:
        raise ArborError(
            "the training trees need both accepted and rejected nodes: collect more trees"
        )
    net = make_classifier()
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in progress_enumerate(list(range(cfg.epochs)), "training C2T", progress):
        picked = neg[
            torch.randint(
                neg.numel(), (min(neg.numel(), cfg.neg_per_pos * pos.numel()),), generator=gen
            )
        ]
        idx = torch.cat([pos, picked])
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        for batch in idx.split(cfg.batch_size):
            opt.zero_grad()
            loss = loss_fn(net(x[batch]).squeeze(-1), y[batch])
            loss.backward()
            opt.step()
    clf = C2TClassifier(net.eval())
    eval_mask = held_mask if held_mask.any() else train_mask
    xe, ye = data.features[eval_mask], data.labels[eval_mask]
    conf = clf.confidence(xe)
    metrics = evaluate(conf, xe[:, 0], ye, cfg.beta)
    # to choose the builder's beta
    metrics["by_beta"] = [evaluate(conf, xe[:, 0], ye, b / 10) for b in range(1, 10)]
    metrics.update(
        train_nodes=int(train_mask.sum()),
        train_positives=int(pos.numel()),
        held_out_trees=int(data.tree_ids[held_mask].unique().numel()),
    )
    clf.meta = {"metrics": metrics, "config": asdict(cfg), **data.source}
    return clf, metrics


# ---------------------------------------------------------------------------- entry points
def train_c2t_models(
    target_model,
    drafter: Drafter,
    prompts: list[list[int]],
    cfg: C2TConfig | None = None,
    *,
    target_name: str,
    draft_name: str,
    prompts_source: str = "given token ids",
    eos_token_ids: tuple[int, ...] = (),
    out: str | Path | None = None,
    progress: bool = True,
) -> tuple[C2TClassifier, dict]:
    """Collect trees with loaded models, train, and save to `out` when given."""
    cfg = cfg or C2TConfig()
    data = collect_training_data(target_model, drafter, prompts, cfg, eos_token_ids, progress)
    data.source = {
        "target": target_name,
        "draft": draft_name,
        "vocab_size": drafter.vocab_size,
        "sampling": asdict(cfg.sampling),
        "label": "greedy" if cfg.sampling.greedy else "sampled",
        "prompts_source": prompts_source,
        "trees": data.num_trees,
        "nodes": int(data.labels.numel()),
        "positive_share": float(data.labels.mean()),
        "machine": machine_info(execution_device(target_model)),
        "created": utc_timestamp(),
    }
    clf, metrics = train(data, cfg, progress)
    if out is not None:
        save_classifier(out, clf)
    return clf, metrics


def train_c2t(
    target: str = "embedded",
    draft: str | None = None,
    cfg: C2TConfig | None = None,
    *,
    out: str | Path | None = None,
    prompts_file: str | Path | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    progress: bool = True,
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | None = None,
) -> tuple[C2TClassifier, dict]:
    """Load the pair by name (draft None = the target's default draft) and train its classifier.

    `out` defaults to the shipped location, but only for the embedded target
    with its distilled draft.
    """
    cfg = cfg or C2TConfig()
    pair = load_pair(target, draft, device, dtype, device_map, max_memory, offload_folder)
    if out is None:
        if (pair.target_name, pair.draft_name) != ("embedded", "embedded-draft"):
            raise ArborError(
                f"give --out: only the embedded pair has a default classifier location "
                f"(this pair is {pair.target_name} + {pair.draft_name})"
            )
        out = DEFAULT_CLASSIFIER
    texts, source = read_prompts(prompts_file, cfg.num_prompts)
    return train_c2t_models(
        pair.target.model,
        pair.drafter,
        [encode_prompt(pair.tokenizer, t) for t in texts],
        cfg,
        target_name=pair.target_name,
        draft_name=pair.draft_name,
        prompts_source=source,
        eos_token_ids=eos_ids(pair.tokenizer, pair.target.model),
        out=out,
        progress=progress,
    )
