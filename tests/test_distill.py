"""Distillation pipeline (tiny random target, seconds) and the shipped draft's vocabulary contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arborspec.errors import ArborError
from arborspec.models import SHIPPED_DRAFT_DIR, load_tokenizer
from arborspec.offline.corpus import distill_prompts
from arborspec.offline.distill import DistillConfig, check_vocab_match, distill, load_data, load_draft, pca_embedding

PROBES = [
    "Hello, world!",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Ünïcödé — naïve café, 日本語, emoji 🙂 and numbers 1234567890.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def target_tok():
    return load_tokenizer("embedded")


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, target_tok):
    """A randomly initialised 1-layer Llama with the embedded target's tokenizer (vocab 49152)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(target_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                      bos_token_id=target_tok.bos_token_id, eos_token_id=target_tok.eos_token_id,
                      pad_token_id=target_tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny_target")
    model.save_pretrained(path)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(path)
    target_tok.save_pretrained(path)
    return path


def test_prompts_are_deterministic_deduplicated_and_not_eval_sets():
    a, b = distill_prompts(300, seed=3), distill_prompts(300, seed=3)
    assert a == b and len(a) == 300 and len(set(a)) == 300
    assert distill_prompts(300, seed=4) != a
    assert any("Python" in p for p in a) and any("Python" not in p for p in a)
    text = " ".join(a).lower()
    assert "mt-bench" not in text and "humaneval" not in text


def test_distill_end_to_end_on_tiny_target(tmp_path, tiny_target, target_tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "draft"
    cfg = DistillConfig(target=str(tiny_target), out_dir=str(out), work_dir=str(tmp_path / "work"),
                        layers=1, hidden=16, intermediate=32, heads=2, kv_heads=1, num_prompts=6,
                        max_new_tokens=6, gen_batch_size=4, topk=8, train_steps=6, warmup_steps=2,
                        batch_size=2, ckpt_every=3, lr=1e-2, threads=1, seed=1)
    result = distill(cfg, progress=False)
    assert result == out
    # data: 2 shards (4 + 2 prompts), one top-k row per generated token
    shards = sorted((tmp_path / "work" / "data").glob("shard_*.safetensors"))
    assert len(shards) == 2
    examples = load_data(tmp_path / "work" / "data")
    assert len(examples) == 6
    for e in examples:
        n_resp = len(e["ids"]) - e["resp_start"]
        assert 1 <= n_resp <= 6 and e["topk_ids"].shape == (n_resp, 8)
        assert torch.all(e["topk_logprobs"] <= 0) and torch.all(e["topk_logprobs"][:, :-1] >= e["topk_logprobs"][:, 1:])
        # the target's generated token is in its own top-k (greedy: it is the top-1)
    # exported HF directory
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "metrics.json"):
        assert (out / name).is_file(), name
    draft = AutoModelForCausalLM.from_pretrained(out)
    assert draft.config.vocab_size == len(target_tok) and draft.config.num_hidden_layers == 1
    assert next(draft.parameters()).dtype == torch.float16
    assert AutoTokenizer.from_pretrained(out).get_vocab() == target_tok.get_vocab()
    check_vocab_match(target_tok, str(out))
    # the exported fp16 weights (tied LM head) reproduce the trained checkpoint's logits
    from arborspec.offline.distill import build_draft
    from safetensors.torch import load_file

    ref = build_draft(cfg, AutoModelForCausalLM.from_pretrained(tiny_target))
    ref.load_state_dict(load_file(str(tmp_path / "work" / "best" / "model.safetensors")), strict=False)
    ref.tie_weights()
    ids = examples[0]["ids"][None]
    with torch.no_grad():
        a, b = ref.eval()(ids).logits, draft.float()(ids).logits
    assert torch.allclose(a, b, atol=2e-2, rtol=1e-2), (a - b).abs().max()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 6 and metrics["parameters"] > 0
    # resume: a rerun with --resume and more steps continues from step 6, keeping the data
    cfg2 = DistillConfig(**{**cfg.__dict__, "train_steps": 8, "resume": True, "stages": "data,train,export"})
    distill(cfg2, progress=False)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 8
    assert len(sorted((tmp_path / "work" / "data").glob("shard_*.safetensors"))) == 2


def test_pca_embedding_keeps_top_directions():
    torch.manual_seed(0)
    emb = torch.randn(500, 3) @ torch.randn(3, 20) + 0.01 * torch.randn(500, 20)
    proj = pca_embedding(emb, 3)
    assert proj.shape == (500, 3)
    # a rank-3 (plus noise) matrix keeps nearly all its centred variance in 3 principal directions
    centred = emb - emb.mean(0)
    assert (proj - proj.mean(0)).pow(2).sum() / centred.pow(2).sum() > 0.99


def test_vocab_mismatch_is_refused(tmp_path, target_tok):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bad = tmp_path / "bad_draft"
    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    LlamaForCausalLM(cfg).save_pretrained(bad)
    # a config-only vocab mismatch
    with pytest.raises(ArborError, match="vocabulary"):
        check_vocab_match(target_tok, cfg)
    with pytest.raises(ArborError, match="vocabulary"):
        load_draft(bad, target_tok)
    # same vocab size, different tokenizer: refused too
    vocab = {f"t{i}": i for i in range(len(target_tok))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0")
    same_size = tmp_path / "same_size_other_tok"
    LlamaForCausalLM(LlamaConfig(**{**cfg.to_dict(), "vocab_size": len(target_tok)})).save_pretrained(same_size)
    other.save_pretrained(same_size)
    with pytest.raises(ArborError, match="tokenizer"):
        load_draft(same_size, target_tok)


def test_shipped_draft_matches_embedded_target(target_tok):
    from arborspec.catalog import embedded_target_dir
    from arborspec.models import resolve_model_path
    from transformers import AutoConfig, AutoTokenizer

    path = Path(resolve_model_path("embedded-draft"))
    assert path == SHIPPED_DRAFT_DIR
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    assert size <= 30 * 1024 * 1024, size
    assert (path / "MODEL_CARD.md").is_file()
    tcfg, dcfg = AutoConfig.from_pretrained(embedded_target_dir()), AutoConfig.from_pretrained(path)
    assert dcfg.vocab_size == tcfg.vocab_size == len(target_tok)
    assert (dcfg.bos_token_id, dcfg.eos_token_id) == (tcfg.bos_token_id, tcfg.eos_token_id)
    dtok = AutoTokenizer.from_pretrained(path)
    assert dtok.get_vocab() == target_tok.get_vocab()
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(dtok, attr) == getattr(target_tok, attr), attr
    assert dtok.all_special_ids == target_tok.all_special_ids
    for text in PROBES:
        assert dtok(text)["input_ids"] == target_tok(text)["input_ids"]
    msgs = [{"role": "user", "content": "Write a haiku."}]
    assert (dtok.apply_chat_template(msgs, add_generation_prompt=True)
            == target_tok.apply_chat_template(msgs, add_generation_prompt=True))
    draft = load_draft(path, target_tok)  # also runs check_vocab_match
    assert draft.get_input_embeddings().weight.shape[0] == tcfg.vocab_size
    with torch.no_grad():
        ids = torch.tensor([target_tok("The capital of France is")["input_ids"]])
        logits = draft(ids).logits
    assert logits.shape == (1, ids.shape[1], tcfg.vocab_size) and torch.isfinite(logits).all()
