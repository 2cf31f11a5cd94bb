"""Tests of the examples/llama training side: the PyTorch model against the
format, the GGUF export against the numpy reference, the training loop and
the committed tokenizer. Run from the repository root:
  python3 -m pytest examples/llama/train
"""
import dataclasses
import json
import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export_gguf  # noqa: E402
import model as llama  # noqa: E402
import reference_forward  # noqa: E402
import train  # noqa: E402

MODELS_DIR = os.path.join(HERE, "..", "models")
TINY = llama.ModelConfig(vocab_size=97, d_model=32, n_layer=2, n_head=4, n_head_kv=2,
                         d_ff=48, context_length=16)


def random_model(cfg, seed=0):
    torch.manual_seed(seed)
    model = llama.Llama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)  # not all ones, so a missing norm weight shows
            else:
                p.normal_(0.0, 0.3)  # large enough that attention is not uniform
    return model.eval()


def save_checkpoint(model, path, role="target"):
    torch.save({"role": role, "config": dataclasses.asdict(model.cfg),
                "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()}}, path)


def export(model, tmp_path, *extra):
    pt, out = str(tmp_path / "m.pt"), str(tmp_path / "m.gguf")
    save_checkpoint(model, pt)
    assert export_gguf.main([pt, out, *extra]) == 0
    return out


def torch_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0].double().numpy()


def rounded_to_f16(model):
    """The model with its matrices rounded as the F16 export stores them."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    return model


TOKENS = [1, 5, 17, 96, 3, 3, 42, 0, 64, 11, 2, 90]


def test_rope_rotates_adjacent_pairs_by_position_times_frequency():
    head_dim, T, base = 8, 5, 10000.0
    x = torch.randn(2, 3, T, head_dim)
    cos, sin = llama.rope_angles(T, head_dim, base)
    got = llama.apply_rope(x, cos, sin)
    for pos in range(T):
        for i in range(head_dim // 2):
            angle = pos * base ** (-2 * i / head_dim)
            a, b = x[..., pos, 2 * i], x[..., pos, 2 * i + 1]
            torch.testing.assert_close(got[..., pos, 2 * i], a * np.cos(angle) - b * np.sin(angle))
            torch.testing.assert_close(got[..., pos, 2 * i + 1], a * np.sin(angle) + b * np.cos(angle))


def test_model_is_causal():
    model = random_model(TINY)
    changed = list(TOKENS)
    changed[7] = 50
    a, b = torch_logits(model, TOKENS), torch_logits(model, changed)
    np.testing.assert_array_equal(a[:7], b[:7])
    assert np.abs(a[7:] - b[7:]).max() > 1e-3


def test_model_has_the_format_parameter_counts():
    # ~24 M and ~5 M parameters, FORMAT.md.
    assert 23e6 < llama.count_parameters(llama.Llama(llama.TARGET)) < 25e6
    assert 4.5e6 < llama.count_parameters(llama.Llama(llama.DRAFT)) < 5.5e6


def test_gguf_metadata_and_tensors_follow_the_format(tmp_path):
    import gguf
    path = export(random_model(TINY), tmp_path)
    reader = gguf.GGUFReader(path)
    fields = {name: field for name, field in reader.fields.items()}
    expected = {
        "general.architecture": (gguf.GGUFValueType.STRING, "llama"),
        "llama.context_length": (gguf.GGUFValueType.UINT32, 16),
        "llama.embedding_length": (gguf.GGUFValueType.UINT32, 32),
        "llama.block_count": (gguf.GGUFValueType.UINT32, 2),
        "llama.feed_forward_length": (gguf.GGUFValueType.UINT32, 48),
        "llama.attention.head_count": (gguf.GGUFValueType.UINT32, 4),
        "llama.attention.head_count_kv": (gguf.GGUFValueType.UINT32, 2),
        "llama.rope.freq_base": (gguf.GGUFValueType.FLOAT32, 10000.0),
        "llama.attention.layer_norm_rms_epsilon": (gguf.GGUFValueType.FLOAT32, np.float32(1e-5)),
        "llama.vocab_size": (gguf.GGUFValueType.UINT32, 97),
        "tokenizer.ggml.bos_token_id": (gguf.GGUFValueType.UINT32, 1),
        "tokenizer.ggml.eos_token_id": (gguf.GGUFValueType.UINT32, 2),
    }
    for key, (vtype, value) in expected.items():
        assert fields[key].types == [vtype], key
        assert fields[key].contents() == value, key
    assert fields["general.name"].contents() == "flashspec-llama-target"
    tensors = {t.name: t for t in reader.tensors}
    hd = 32 // 4
    shapes = {"token_embd.weight": (97, 32), "output_norm.weight": (32,)}
    for i in range(2):
        shapes.update({
            "blk.%d.attn_norm.weight" % i: (32,), "blk.%d.ffn_norm.weight" % i: (32,),
            "blk.%d.attn_q.weight" % i: (4 * hd, 32), "blk.%d.attn_k.weight" % i: (2 * hd, 32),
            "blk.%d.attn_v.weight" % i: (2 * hd, 32), "blk.%d.attn_output.weight" % i: (32, 4 * hd),
            "blk.%d.ffn_gate.weight" % i: (48, 32), "blk.%d.ffn_up.weight" % i: (48, 32),
            "blk.%d.ffn_down.weight" % i: (32, 48)})
    assert set(tensors) == set(shapes)  # in particular no output.weight: tied
    for name, shape in shapes.items():
        assert tuple(tensors[name].data.shape) == shape, name
        assert list(tensors[name].shape) == list(reversed(shape)), name  # GGUF ne[0] = in_features
        want = gguf.GGMLQuantizationType.F32 if len(shape) == 1 else gguf.GGMLQuantizationType.F16
        assert tensors[name].tensor_type == want, name


def test_numpy_reference_of_f16_export_matches_torch(tmp_path):
    model = rounded_to_f16(random_model(TINY))
    path = export(model, tmp_path)
    ref = reference_forward.ReferenceModel(path).logits(TOKENS)
    want = torch_logits(model, TOKENS)
    assert np.abs(want).max() > 1.0  # the comparison is not between near-zero logits
    np.testing.assert_allclose(ref, want, atol=1e-3, rtol=0)


def test_numpy_reference_of_f32_export_matches_torch(tmp_path):
    model = random_model(TINY, seed=3)
    path = export(model, tmp_path, "--f32")
    ref = reference_forward.ReferenceModel(path).logits(TOKENS)
    np.testing.assert_allclose(ref, torch_logits(model, TOKENS), atol=1e-3, rtol=0)


def rotate_half_rope(self, x):
    """HF's convention (pairs i and i + head_dim/2): the wrong one here."""
    T, half = x.shape[0], self.head_dim // 2
    freqs = self.rope_base ** (-np.arange(0, self.head_dim, 2) / self.head_dim)
    angles = np.arange(T)[:, None, None] * freqs[None, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles), a * np.sin(angles) + b * np.cos(angles)], -1)


def test_parity_check_rejects_a_wrong_rope_convention(tmp_path, monkeypatch):
    # The power of the parity test: the other common RoPE layout fails it.
    model = random_model(TINY, seed=3)
    path = export(model, tmp_path, "--f32")
    monkeypatch.setattr(reference_forward.ReferenceModel, "rope", rotate_half_rope)
    ref = reference_forward.ReferenceModel(path).logits(TOKENS)
    assert np.abs(ref - torch_logits(model, TOKENS)).max() > 1e-2


def test_parity_check_rejects_a_wrong_gqa_head_mapping(tmp_path, monkeypatch):
    # Query head h must read kv head h // group, not h % n_head_kv.
    model = random_model(TINY, seed=3)
    path = export(model, tmp_path, "--f32")
    wrong = llama.Llama(TINY)
    wrong.load_state_dict(model.state_dict())
    monkeypatch.setattr(torch.Tensor, "repeat_interleave",
                        lambda self, n, dim: self.repeat(*[n if d == dim else 1 for d in range(self.dim())]))
    got_wrong = torch_logits(wrong.eval(), TOKENS)
    monkeypatch.undo()
    ref = reference_forward.ReferenceModel(path).logits(TOKENS)
    assert np.abs(ref - got_wrong).max() > 1e-2
    np.testing.assert_allclose(ref, torch_logits(model, TOKENS), atol=1e-3, rtol=0)


def test_export_refuses_a_checkpoint_of_another_shape(tmp_path):
    model = random_model(TINY)
    pt = str(tmp_path / "m.pt")
    state = {k: v for k, v in model.state_dict().items() if k != "blocks.1.ffn_up.weight"}
    torch.save({"role": "target", "config": dataclasses.asdict(TINY), "state_dict": state}, pt)
    with pytest.raises(ValueError, match="ffn_up"):
        export_gguf.main([pt, str(tmp_path / "m.gguf")])
    assert not os.path.exists(tmp_path / "m.gguf")


def test_learning_rate_warms_up_then_decays_over_the_budget():
    assert train.learning_rate(1.0, 0, 100, 0.0) == pytest.approx(0.01)
    assert train.learning_rate(1.0, 99, 100, 0.0) == pytest.approx(1.0)
    assert train.learning_rate(1.0, 500, 100, 0.5) == pytest.approx(0.55)
    assert train.learning_rate(1.0, 500, 100, 1.0) == pytest.approx(0.1)


def test_training_lowers_the_loss_and_writes_its_outputs(tmp_path):
    # A periodic token stream: learnable in a few dozen steps. The step cap,
    # not the generous time budget, ends each run on a slow or busy machine.
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pattern = np.arange(3, 40, dtype=np.uint16)
    np.tile(pattern, 400).tofile(data / "train.bin")
    np.tile(pattern, 40).tofile(data / "val.bin")
    assert train.main(["--data", str(data), "--out", str(out), "--smoke", "--device", "cpu",
                       "--target-seconds", "300", "--draft-seconds", "300", "--max-steps", "40",
                       "--target-lr", "3e-3", "--draft-lr", "6e-3", "--eval-windows", "4"]) == 0
    with open(out / "train_log.json") as f:
        log = json.load(f)
    for role in ("target", "draft"):
        entry = log[role]
        assert entry["steps"] == 40 and entry["tokens_seen"] == entry["steps"] * 8 * 128
        first = entry["history"][0]["val_loss"]
        assert first > 9.0  # ln(16000) = 9.68 at initialisation
        assert entry["final_val_loss"] < first - 1.0, entry["history"]
        assert entry["checkpoint"]["val_loss"] == min(h["val_loss"] for h in entry["history"])
        cfg, state, _ = export_gguf.load_checkpoint(str(out / (role + ".pt")))
        assert cfg == (llama.SMOKE_TARGET if role == "target" else llama.SMOKE_DRAFT)
        assert (out / (role + ".gguf")).is_file()
    assert log["gguf"] == ["target.gguf", "draft.gguf"]


def heldout_files():
    with open(os.path.join(MODELS_DIR, "corpus_files.txt"), encoding="utf-8") as f:
        return [line.split("\t")[1].rstrip("\n") for line in f if line.startswith("heldout\t")]


def test_committed_tokenizer_round_trips_heldout_stdlib_files():
    import sentencepiece as spm
    stdlib = "/usr/lib/python3.11"
    sp = spm.SentencePieceProcessor(model_file=os.path.join(MODELS_DIR, "tokenizer.model"))
    assert sp.get_piece_size() == 16000
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    assert sp.encode("a\nb") == sp.encode("a") + [sp.piece_to_id("\n")] + sp.encode("b")
    names = heldout_files()
    assert len(names) >= 4
    for name in names:
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            text = f.read()
        assert sp.decode(sp.encode(text)) == text, name
    odd = "\tx = 'ü€😀'  \r\n\n\n        # 0123456789\x0c\n"
    assert sp.decode(sp.encode(odd)) == odd
