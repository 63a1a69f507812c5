"""C2T: exact features, a classifier that beats the joint-probability rule, the file format, lossless decoding; C2T in
chain mode (`c2t-chain`): the top-1 path, stopped exactly where the confidence first drops below beta."""

from __future__ import annotations

import math

import arborspec.builders.c2t_classifier as c2t_classifier
import pytest
import torch
from arborspec.builders.base import top_children
from arborspec.builders.c2t_classifier import (
    C2TClassifier,
    c2t_features,
    load_classifier,
    make_classifier,
    save_classifier,
    top_entropy,
)
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError
from arborspec.offline.c2t import C2TConfig, C2TDataset, label_tree, train, train_c2t_models

from conftest import TableDrafter, perturbed_copy, table_ctx, tiny_llama


def fixed_drafter(root: list[float], rest: list[float]) -> TableDrafter:
    """The root's draft distribution is `root`, every other node's is `rest`."""
    return TableDrafter(lambda path: torch.tensor(rest if path else root), len(root))


def entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_features_on_a_hand_case():
    root, rest = [0.5, 0.3, 0.2, 0.0], [0.15, 0.1, 0.7, 0.05]
    ctx = table_ctx(fixed_drafter(root, rest))
    tree = TokenTree.from_root(3)
    cands = top_children(ctx, tree, [0], 8)
    features = c2t_features(cands)
    assert cands.tokens == [0, 1, 2]  # zero-probability token 3 is never proposed
    torch.testing.assert_close(features[:, 0], torch.tensor([0.5, 0.3, 0.2]))
    torch.testing.assert_close(features[:, 1], torch.full((3,), entropy(root)))
    assert features[:, 2].tolist() == [1.0, 1.0, 1.0]
    child = tree.add(0, 1, value=0.3)
    cands = top_children(ctx, tree, [child], 2)
    features = c2t_features(cands)
    assert cands.tokens == [2, 0] and cands.parents == [child, child]
    torch.testing.assert_close(features[:, 0], torch.tensor([0.3 * 0.7, 0.3 * 0.15]))
    torch.testing.assert_close(features[:, 1], torch.full((2,), entropy(rest)))
    assert features[:, 2].tolist() == [2.0, 2.0]


def test_entropy_counts_only_the_top_1000():
    probs = torch.cat([torch.full((1000,), 0.9 / 1000), torch.full((500,), 0.1 / 500)])
    expected = -1000 * (0.9 / 1000) * math.log(0.9 / 1000)
    assert float(top_entropy(probs[None])[0]) == pytest.approx(expected, rel=1e-5)


def test_labels_follow_the_greedy_path():
    tree = TokenTree.from_root(0)
    a, b = tree.add(0, 5), tree.add(0, 6)
    tree.add(a, 7), tree.add(b, 7)  # nodes 3 and 4
    logits = torch.zeros(5, 10)
    logits[0, 5] = logits[a, 7] = logits[b, 7] = 1.0
    assert label_tree(tree, logits, SamplingConfig(0.0)).tolist() == [True, True, False, True, False]


def synthetic_trees(n_trees: int, nodes: int, seed: int) -> C2TDataset:
    """Acceptance depends on entropy and depth as well as on the joint probability."""
    gen = torch.Generator().manual_seed(seed)
    joint = torch.rand(n_trees * nodes, generator=gen) ** 3
    ent = torch.rand(n_trees * nodes, generator=gen) * 6
    depth = torch.randint(1, 7, (n_trees * nodes,), generator=gen).float()
    logit = 3 * torch.log(joint + 1e-3) / 3 - 1.2 * ent - 0.5 * depth + 5
    labels = (torch.rand(joint.shape, generator=gen) < torch.sigmoid(logit)).float()
    return C2TDataset(torch.stack([joint, ent, depth], -1), labels, torch.arange(n_trees).repeat_interleave(nodes))


def test_classifier_beats_joint_probability_at_equal_positive_rate():
    data = synthetic_trees(100, 100, 0)
    clf, m = train(data, C2TConfig(epochs=15, neg_per_pos=4, beta=0.7, lr=1e-2, batch_size=2048))
    assert m["positives"] > 100 and 0 < m["positive_rate"] < 0.5
    assert m["recall"] > m["joint_probability_recall"] + 0.05, m


@pytest.fixture(scope="module")
def close_pair():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 1, 0.05)


@pytest.fixture(scope="module")
def tiny_classifier(close_pair, tmp_path_factory):
    target, draft = close_pair
    prompts = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(5)).tolist()
    cfg = C2TConfig(k=3, depth=3, max_new_tokens=8, positions_per_prompt=2, epochs=10, beta=0.5)
    path = tmp_path_factory.mktemp("c2t") / "tiny.safetensors"
    clf, metrics = train_c2t_models(target, ModelDrafter(draft), prompts, cfg, target_name="tiny-t",
                                    draft_name="tiny-d", out=path, progress=False)
    return clf, metrics, path


def test_tiny_pair_training_and_round_trip(tiny_classifier):
    clf, metrics, path = tiny_classifier
    assert metrics["train_positives"] > 0 and 0 <= metrics["recall"] <= 1 and metrics["held_out_trees"] == 1
    loaded = load_classifier(path, target="tiny-t", draft="tiny-d", vocab_size=96)
    assert loaded.meta["vocab_size"] == 96 and loaded.meta["metrics"] == metrics
    x = torch.tensor([[0.5, 1.0, 1.0], [0.01, 3.0, 4.0]])
    torch.testing.assert_close(loaded.confidence(x), clf.confidence(x))


def test_load_validation_errors(tiny_classifier, tmp_path):
    _, _, path = tiny_classifier
    with pytest.raises(ArborError, match="trained for target 'tiny-t', not 'embedded'"):
        load_classifier(path, target="embedded")
    with pytest.raises(ArborError, match="draft"):
        load_classifier(path, draft="other")
    with pytest.raises(ArborError, match="vocabulary of 96"):
        load_classifier(path, vocab_size=49152)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(ArborError, match="not a safetensors file"):
        load_classifier(garbage)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ArborError, match="not an arborspec C2T classifier"):
        load_classifier(tmp_path / "plain.safetensors")
    with pytest.raises(ArborError, match="does not exist"):
        load_classifier(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("name", ["c2t", "c2t-chain"])
def test_builder_errors(monkeypatch, tmp_path, tiny_classifier, name):
    monkeypatch.setattr(c2t_classifier, "DEFAULT_CLASSIFIER", tmp_path / "absent.safetensors")
    with pytest.raises(ArborError, match="train-c2t"):
        make_builder(name)
    with pytest.raises(ArborError, match=r"beta must be in \[0, 1\]"):
        make_builder(name, classifier="none", beta=1.5)
    _, _, path = tiny_classifier
    builder = make_builder(name, classifier=str(path))
    ctx = table_ctx(fixed_drafter([0.02] * 50, [0.02] * 50))
    with pytest.raises(ArborError, match="vocabulary of 96"):
        builder.build(ctx, 0)


def greedy_identity(target, draft, builder, n_prompts: int = 2) -> float:
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), builder)
    steps = tokens = 0
    for i in range(n_prompts):
        prompt = torch.randint(3, 96, (7,), generator=torch.Generator().manual_seed(100 + i)).tolist()
        cfg = DecodeConfig(max_new_tokens=10, seed=i)
        spec = dec.generate(prompt, cfg)
        plain = autoregressive_generate(ModelAdapter(target), prompt, cfg)
        assert spec.output_ids == plain.output_ids
        assert all(s.tree_size <= builder.budget and s.tree_depth <= builder.max_depth for s in spec.steps)
        steps, tokens = steps + len(spec.steps), tokens + spec.new_tokens
    return tokens / steps


def test_c2t_greedy_equals_plain_decoding(close_pair, tiny_classifier):
    target, draft = close_pair
    _, _, path = tiny_classifier
    mal = greedy_identity(target, draft, make_builder("c2t", budget=12, classifier=str(path), beta=0.2, topk=3,
                                                      max_depth=4))
    assert mal > 1.0  # the trees were not empty: some draft tokens were accepted


def test_joint_probability_rule_equals_plain_decoding(close_pair):
    target, draft = close_pair
    mal = greedy_identity(target, draft, make_builder("c2t", budget=10, classifier="none", beta=0.05, topk=3,
                                                      max_depth=4))
    assert mal > 1.0


# --------------------------------------------------------------------------- chain mode
CHAIN_VOCAB = 6
CHAIN_TOP = [0.9, 0.8, 0.7, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]  # the top-1 probability after a path of each length


def chain_top_token(path: tuple[int, ...]) -> int:
    return (3 * sum(path) + len(path) + 1) % CHAIN_VOCAB


def chain_dist(path: tuple[int, ...]) -> torch.Tensor:
    """Top-1 token `chain_top_token(path)` with probability CHAIN_TOP[len(path)]; the rest spread evenly."""
    top = CHAIN_TOP[len(path)]
    dist = torch.full((CHAIN_VOCAB,), (1 - top) / (CHAIN_VOCAB - 1))
    dist[chain_top_token(path)] = top
    return dist


def build_chain(**params) -> tuple[TokenTree, TableDrafter]:
    drafter = TableDrafter(chain_dist, CHAIN_VOCAB)
    tree = make_builder("c2t-chain", **params).build(table_ctx(drafter), 0)
    return tree, drafter


def assert_top1_chain(tree: TokenTree, length: int) -> None:
    """The tree is the draft's top-1 path of `length` nodes, each valued at its joint probability."""
    assert tree.size == length and tree.children_mode == "selected"
    assert tree.parents[1:] == list(range(length))  # one child per node
    path: tuple[int, ...] = ()
    for node in range(1, length + 1):
        assert tree.tokens[node] == chain_top_token(path)
        path += (tree.tokens[node],)
    joint = [math.prod(CHAIN_TOP[:d]) for d in range(1, length + 1)]
    assert tree.values[1:] == pytest.approx(joint, rel=1e-6)


# joint probabilities along the chain: 0.9, 0.72, 0.504, 0.3024, 0.1512, ...
@pytest.mark.parametrize("beta,length", [(0.95, 0), (0.85, 1), (0.5, 3), (0.3, 4), (0.1, 5)])
def test_chain_stops_where_the_joint_probability_first_drops_below_beta(beta, length):
    tree, drafter = build_chain(classifier="none", beta=beta, budget=8)
    assert_top1_chain(tree, length)
    # one draft forward per depth, one row each: every chain node is expanded to judge its child
    assert drafter.forwards == drafter.rows == length


def test_chain_is_capped_by_budget_and_max_depth():
    for params, length in [(dict(budget=5), 5), (dict(budget=8, max_depth=3), 3), (dict(budget=2, max_depth=6), 2),
                           (dict(budget=1), 1)]:
        tree, drafter = build_chain(classifier="none", beta=0.0, **params)
        assert_top1_chain(tree, length)
        assert drafter.forwards == drafter.rows == length - 1  # the last node is never expanded


def linear_classifier(path, weights: list[float], bias: float, meta: dict) -> str:
    """A classifier file whose confidence is exactly sigmoid(weights . features + bias): two hidden units,
    relu(z) - relu(-z) = z."""
    net = make_classifier()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net[0].weight[0], net[0].bias[0] = torch.tensor(weights), bias
        net[0].weight[1], net[0].bias[1] = -torch.tensor(weights), -bias
        net[2].weight[0, :2] = torch.tensor([1.0, -1.0])
    save_classifier(path, C2TClassifier(net, meta))
    return str(path)


def test_chain_stops_where_the_classifier_confidence_first_drops_below_beta(tmp_path):
    # z = 5 * joint - parent entropy - 0.5 * depth + 0.2
    path = linear_classifier(tmp_path / "linear.safetensors", [5.0, -1.0, -0.5], 0.2,
                             {"vocab_size": CHAIN_VOCAB, "recommended_beta": 0.5})
    z = []
    for depth in range(1, 6):
        parent = chain_dist(tuple(range(depth - 1)))  # the distribution's entropy depends on the depth alone
        entropy = -float((parent * parent.log()).sum())
        z.append(5 * math.prod(CHAIN_TOP[:depth]) - entropy - 0.5 * depth + 0.2)
    assert [zi > 0.85 for zi in z] == [True, True, False, False, False]  # logit(0.7) = 0.847
    assert [zi > 0 for zi in z] == [True, True, True, False, False]  # logit(0.5) = 0
    tree, drafter = build_chain(classifier=path, beta=0.7)
    assert_top1_chain(tree, 2)  # the joint-probability rule at beta 0.7 stops after 1 node
    assert drafter.forwards == 2
    tree, _ = build_chain(classifier=path)  # beta = the file's recommended 0.5
    assert_top1_chain(tree, 3)
    tree, _ = build_chain(classifier=path, beta=0.0, budget=4)
    assert_top1_chain(tree, 4)


def test_chain_refuses_more_than_one_child():
    for topk in (2, 0):
        with pytest.raises(ArborError, match="topk must be 1.*use method c2t"):
            make_builder("c2t-chain", classifier="none", topk=topk)
    assert make_builder("c2t-chain", classifier="none", topk=1).topk == 1
    with pytest.raises(ArborError, match="max_depth must be >= 1"):
        make_builder("c2t-chain", classifier="none", max_depth=0)


def test_c2t_chain_greedy_equals_plain_decoding(close_pair, tiny_classifier):
    target, draft = close_pair
    _, _, path = tiny_classifier
    mal = greedy_identity(target, draft, make_builder("c2t-chain", budget=6, classifier=str(path), beta=0.2,
                                                      max_depth=5))
    assert mal > 1.0
