"""The EAGLE-style draft head: FR-Spec keeps the target law, int8 draft logits and layers, training, files,
features. Its greedy identity with every builder, in float and int8, is tests/test_greedy_identity.py's."""

import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.drafters.head import HeadDrafter, load_head
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError
from arborspec.offline.head_data import FeatureRecorder, HeadDataConfig, HeadSequence, _generate_batch
from arborspec.offline.train_head import make_batch, train, ttt_mask

from conftest import GREEDY_PROMPTS as PROMPTS
from conftest import assert_first_two_follow, greedy_sequences, make_head, tiny_llama


@pytest.fixture(scope="module")
def target(head_target):
    """The tiny target the shared head (`trained_head`, conftest) was trained on."""
    return head_target


# --------------------------------------------------------------------------- losslessness


def test_trained_head_makes_trees_accept_more(target, trained_head):
    head, seqs = trained_head[0], trained_head[3]
    prompt = seqs[0].tokens[: seqs[0].prompt_len].tolist()
    cfg = DecodeConfig(max_new_tokens=32)
    means = []
    for drafter in (HeadDrafter(head), HeadDrafter(make_head(target, torch.arange(64)))):
        res = SpeculativeDecoder(ModelAdapter(target), drafter, make_builder("dyspec", budget=8)).generate(prompt, cfg)
        assert res.output_ids == autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
        means.append(sum(s.accepted_length for s in res.steps) / len(res.steps))
    assert means[0] > 1.4 and means[0] > means[1] + 0.3, means  # the gain comes from training


N_RUNS = 800


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dyspec", "specinfer", "sequoia", "opt-tree"])
def test_fr_restricted_head_keeps_the_target_distribution(small_vocab_pair, name):
    """The draft may only propose 6 of 16 tokens; the first two sampled tokens over 800 seeds still follow the
    target's laws (chi-square, conftest; laws 0.1 away in total variation are rejected), and a law that keeps
    to the draft vocabulary is rejected too."""
    from conftest import assert_departs

    target = small_vocab_pair[0]
    vocab = torch.tensor([0, 3, 5, 7, 11, 12])
    head = make_head(target, vocab_ids=vocab)
    cfg = SamplingConfig(0.8, top_p=0.95)
    prompt = [3, 7, 1, 12]
    dec = SpeculativeDecoder(ModelAdapter(target), HeadDrafter(head), make_builder(name, budget=6))
    (first, _), (p1, _) = assert_first_two_follow(dec, target, prompt, cfg, N_RUNS, name, detects=0.1)
    assert p1[[1, 2, 4]].sum() > 0.05  # tokens outside the draft vocabulary do occur: the test has teeth
    inside = torch.zeros_like(p1)
    inside[vocab] = p1[vocab]
    assert_departs(first, inside, what="the target's law kept to the draft vocabulary")


def test_fr_restricted_logits_put_zero_probability_outside_the_draft_vocabulary(target):
    head = make_head(target, vocab_ids=torch.tensor([4, 9, 50]))
    drafter = HeadDrafter(head)
    drafter.observe(torch.randn(4, target.config.hidden_size))
    logits = drafter.begin([5, 6, 7, 8, 9])
    probs = logits.softmax(-1)
    assert torch.isfinite(logits[[4, 9, 50]]).all()
    assert float(probs.sum() - probs[[4, 9, 50]].sum()) == 0.0


@pytest.fixture(scope="module")
def int8_head(target, trained_head, tmp_path_factory):
    """The trained head, reloaded with int8 draft logits (draft-side precision)."""
    path = tmp_path_factory.mktemp("int8-head")
    trained_head[0].save(path, "tiny", target)
    return load_head(path, target, int8_logits=True)


def test_int8_draft_logits_are_the_int8_product_and_close_to_float(target, trained_head, int8_head):
    from arborspec.engine.int8 import ACT_LEVELS

    head = trained_head[0]
    hidden = head(torch.tensor([[5, 6, 7, 8]]), torch.randn(1, 4, target.config.hidden_size))[0]
    got = int8_head.draft_logits(hidden)
    # written out: each row quantised with its own scale, int8 weights with one scale per output channel
    scale = hidden.abs().amax(1, keepdim=True) / ACT_LEVELS
    q = torch.clamp(torch.round(hidden / scale), -ACT_LEVELS, ACT_LEVELS)
    w = head.lm_rows
    w_scale = w.abs().amax(1, keepdim=True) / 63
    expect = (q @ torch.round(w / w_scale).T) * scale * w_scale.T
    assert torch.allclose(got, expect, rtol=1e-4, atol=1e-4)
    full = head.draft_logits(hidden)
    assert (got - full).abs().max() < 0.05 * full.abs().max()
    assert torch.equal(torch.cat([int8_head.draft_logits(hidden[i:i + 1]) for i in range(4)]), got)  # row by row
    int8_head.refresh_lm_rows()  # the rows are re-derived from the target: the logits stay int8
    assert int8_head.int8_logits and torch.equal(int8_head.draft_logits(hidden), got)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [False, True], ids=["int8-logits", "int8-layer-and-logits"])
def test_int8_draft_logits_keep_the_target_distribution(small_vocab_pair, tmp_path, layers):
    """The first two sampled tokens over 800 seeds follow the target's laws (chi-square, conftest; laws 0.1
    away in total variation are rejected)."""
    target = small_vocab_pair[0]
    make_head(target, vocab_ids=torch.tensor([0, 3, 5, 7, 11, 12])).save(tmp_path, "small", target)
    head = load_head(tmp_path, target, int8_logits=True, int8_layers=layers)
    assert head.int8_layers == layers
    cfg = SamplingConfig(0.8, top_p=0.95)
    prompt = [3, 7, 1, 12]
    dec = SpeculativeDecoder(ModelAdapter(target), HeadDrafter(head), make_builder("dyspec", budget=6))
    assert_first_two_follow(dec, target, prompt, cfg, N_RUNS, "int8 head", detects=0.1)


@pytest.fixture(scope="module")
def int8_layers_head(target, trained_head, tmp_path_factory):
    """The trained head reloaded as CPU pairs run it by default: fc, the decoder layer and the logits in int8."""
    path = tmp_path_factory.mktemp("int8-layers-head")
    trained_head[0].save(path, "tiny", target)
    return load_head(path, target, int8_logits=True, int8_layers=True)


def test_int8_layers_replace_every_linear_and_stay_close_to_the_float_head(target, trained_head, int8_layers_head):
    from arborspec.engine.int8 import Int8GroupMember, Int8Linear

    assert not any(isinstance(m, torch.nn.Linear) for m in int8_layers_head.modules())
    layer = int8_layers_head.body.layers[0]
    assert all(isinstance(getattr(layer.self_attn, n), Int8GroupMember) for n in ("q_proj", "k_proj", "v_proj"))
    assert isinstance(int8_layers_head.fc, Int8Linear) and isinstance(layer.mlp.down_proj, Int8Linear)
    head = trained_head[0]
    tokens, feats = torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.randn(1, 6, target.config.hidden_size)
    with torch.no_grad():
        want, got = head(tokens, feats)[0], int8_layers_head(tokens, feats)[0]
    assert not torch.equal(got, want)  # it really runs another precision
    assert (got - want).norm() < 0.1 * want.norm()  # 8-bit rows, 7-bit weights: a few per cent on this tiny model
    agree = (head.draft_logits(want).argmax(-1) == int8_layers_head.draft_logits(got).argmax(-1)).float().mean()
    assert agree >= 0.8, float(agree)


def test_a_head_with_int8_layers_is_not_saved(target, int8_layers_head, tmp_path):
    with pytest.raises(ArborError, match="int8 layers"):
        int8_layers_head.save(tmp_path, "tiny", target)
    assert not (tmp_path / "head.safetensors").exists()


# --------------------------------------------------------------------------- training and files


def test_training_lowers_the_loss_and_raises_agreement(trained_head):
    _, info, before, *_ = trained_head
    after = info["best"]
    assert after["loss"] < 0.7 * before["loss"], (before, after)
    assert after["top1_depth1"] > before["top1_depth1"] + 0.3, (before, after)
    assert after["top1_depth2"] > before["top1_depth2"] + 0.2, (before, after)


def test_head_round_trips_through_save_and_load(target, trained_head, tmp_path):
    head = trained_head[0]
    head.save(tmp_path, "tiny", target)
    loaded = load_head(tmp_path, target)
    tokens, feats = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, target.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(head(tokens, feats), loaded(tokens, feats))
    assert torch.equal(head.vocab_ids, loaded.vocab_ids)


def test_training_can_start_from_an_exported_head(target, trained_head, tmp_path):
    from dataclasses import replace

    head, info, _, seqs, cfg, _ = trained_head
    head.save(tmp_path / "start", "tiny", target)
    again = replace(cfg, out=str(tmp_path / "out"), work_dir=str(tmp_path / "w"), epochs=0.01,
                    init_from=str(tmp_path / "start"))
    warm, warm_info = train(again, target, seqs, seqs, progress=False)
    cold, cold_info = train(replace(again, init_from=""), target, seqs, seqs, progress=False)
    # one step on top of the trained weights stays far better than one step from the target's last layer
    assert warm_info["history"][-1]["top1_depth1"] > cold_info["history"][-1]["top1_depth1"] + 0.2
    with pytest.raises(ArborError, match="not a draft head directory"):
        train(replace(again, init_from=str(tmp_path)), target, seqs, seqs, progress=False)


def test_head_for_another_target_or_vocabulary_is_refused(target, trained_head, tmp_path):
    trained_head[0].save(tmp_path, "tiny", target)
    with pytest.raises(ArborError, match="another target"):
        load_head(tmp_path, tiny_llama(7, layers=2))
    with pytest.raises(ArborError, match="vocabulary"):
        load_head(tmp_path, tiny_llama(0, vocab=80, layers=2))
    with pytest.raises(ArborError, match="not a draft head"):
        load_head(tmp_path / "missing", target)


def test_ttt_mask_matches_the_tree_a_depth_two_node_sees():
    pad = torch.tensor([[True, True, True, True, False]])
    m = ttt_mask(pad, 2, torch.float32)[0, 0] == 0  # [5, 10] allowed
    # pass 2 row 3 = depth-1 node after root row 2: true rows 0..2 of pass 1 (not row 3) + itself
    assert m[3].tolist() == [True, True, True, False, False] + [False, False, False, True, False]
    # pass 2 row 0 has no root before it: it sees only itself
    assert m[0].tolist() == [False] * 5 + [True, False, False, False, False]
    m3 = ttt_mask(pad, 3, torch.float32)[0, 0] == 0  # [5, 15]
    # pass 3 row 3 = depth-2 node: root row 1, pass-2 row 2, itself
    assert m3[3].tolist() == ([True, True, False, False, False] + [False, False, True, False, False]
                              + [False, False, False, True, False])


def test_make_batch_aligns_features_with_rows():
    s = HeadSequence(torch.tensor([10, 11, 12, 13]), torch.arange(3 * 2, dtype=torch.float16).view(3, 2), prompt_len=2)
    b = make_batch([s], max_len=16)
    assert b.prev[0, 0].tolist() == [0, 0] and b.prev[0, 1].tolist() == [0, 1] and b.prev[0, 3].tolist() == [4, 5]
    assert b.target[0, 2].tolist() == [4, 5]
    assert b.valid[0].tolist() == [False, True, True, False]  # root row (1) .. last row with a known feature (2)


# --------------------------------------------------------------------------- features


def test_adapter_returns_the_hidden_states_of_a_plain_forward(target):
    adapter = ModelAdapter(target)
    adapter.capture_hidden(True)
    prompt = [5, 17, 33, 8]
    adapter.prefill(torch.tensor(prompt[:-1]))
    tree = TokenTree.from_root(prompt[-1])
    a = tree.add(0, 11)
    tree.add(0, 12)
    tree.add(a, 13)
    adapter.tree_forward(tree)
    got = adapter.last_hidden
    for node in range(tree.num_nodes):
        seq = prompt + tree.path_tokens(node)
        with torch.no_grad():
            want = target.model(input_ids=torch.tensor([seq])).last_hidden_state[0, -1]
        assert torch.allclose(got[node], want, atol=1e-5), node


def test_generated_data_features_match_a_teacher_forced_pass(target):
    recorder = FeatureRecorder(target)
    enc = [[5, 6, 7, 8, 9], [20, 21]]
    shard, n_new = _generate_batch(target, recorder, enc, pad_id=0, eos_set={2},
                                   cfg=HeadDataConfig(max_new_tokens=6), sampled=False, seed=0)
    recorder.close()
    offs = shard["offsets"].tolist()
    fo = 0
    for i in range(2):
        seq = shard["tokens"][offs[i]:offs[i + 1]].long()
        n = len(seq)
        with torch.no_grad():
            want = target.model(input_ids=seq[None]).last_hidden_state[0, :-1]
        assert torch.allclose(shard["feats"][fo:fo + n - 1].float(), want, atol=2e-2)
        fo += n - 1
    assert n_new == len(shard["tokens"]) - 7


def test_offline_tools_run_the_head_along_a_sequence_with_the_targets_features(target, trained_head):
    """`arborspec calibrate` and `train-c2t` run a drafter along finished sequences, outside the step loop: the head
    drafter gets the target's features there too (it had none and raised), and its logits at each position are the
    ones a fresh `begin` gives after observing the features of a cached prefill, the way the step loop feeds it."""
    from arborspec.offline.calibrate import draft_logits_along

    head = trained_head[0]
    ids = greedy_sequences(target, 1, new=10, seed=3)[0].tokens.tolist()
    adapter = ModelAdapter(target)
    along = draft_logits_along(HeadDrafter(head), ids, 5, adapter)
    adapter.capture_hidden(True)
    adapter.prefill(torch.tensor(ids))
    feats = adapter.last_hidden
    for row, i in enumerate(range(5, len(ids))):
        fresh = HeadDrafter(head)
        fresh.observe(feats[:i])
        assert torch.allclose(along[row], fresh.begin(ids[: i + 1]), atol=1e-4), i
    with pytest.raises(ValueError, match="target's features"):
        draft_logits_along(HeadDrafter(head), ids, 5)


def test_c2t_training_data_can_be_collected_with_the_head(target, trained_head):
    from arborspec.offline.c2t import C2TConfig, collect_training_data

    cfg = C2TConfig(k=2, depth=2, max_new_tokens=6, positions_per_prompt=2)
    data = collect_training_data(target, HeadDrafter(trained_head[0]), PROMPTS[:2], cfg, progress=False)
    assert data.num_trees == 4 and data.labels.shape[0] == data.features.shape[0] > 0


def test_the_cost_curve_times_the_head_after_it_observed_the_context(target, trained_head):
    from arborspec.engine.cost import measure_cost_curve, measure_draft_seconds

    curve = measure_cost_curve(ModelAdapter(target), HeadDrafter(trained_head[0]), context_len=16, sizes=(1, 4),
                               repeats=2)
    assert curve.draft_cost > 0 and curve.context == 16
    with pytest.raises(ValueError, match="target's features"):
        measure_draft_seconds(HeadDrafter(trained_head[0]), list(range(3, 19)), 2)
