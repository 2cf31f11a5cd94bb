#!/usr/bin/env python3
"""Writes the runtime tests' fixtures into a directory laid out like
examples/llama/models: a small SentencePiece tokenizer, two random-weight
Llama models written with the PyPI `gguf` package's GGUFWriter, a prompt, and
reference hidden rows from reference_forward.py.

  python3 -m venv /tmp/venv-fixtures && /tmp/venv-fixtures/bin/pip install gguf numpy sentencepiece
  /tmp/venv-fixtures/bin/python examples/llama/runtime/tests/make_fixtures.py examples/llama/runtime/tests/fixtures

With --contract-size it writes random-weight models of the contract's sizes
instead (target d=512, 6 layers; draft d=256, 2 layers; vocabulary 16000,
context 512) and a 16000-piece tokenizer trained on more of the standard
library: a stand-in for the trained pair when timing the runtime.
With --fuzz-seeds DIR (tests/fuzz/corpus/gguf) it writes the seeds of the
fuzz_gguf harness.

target.gguf follows the contract's dtypes (F16 matrices, F32 norms); draft.gguf
is all F32, so both conversions are exercised. The draft is the target's
embedding and first block (the target's second block is scaled down), so it
agrees with the target often: speculative tests then see accepted and
rejected drafts. The tokenizer is trained on a few Python standard library
files, with the contract's options.
"""
import io
import os
import sys

import numpy as np
import sentencepiece as spm
from gguf import GGUFWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward  # noqa: E402

TRAINING_FILES = ["/usr/lib/python3.11/textwrap.py", "/usr/lib/python3.11/bisect.py",
                  "/usr/lib/python3.11/keyword.py", "/usr/lib/python3.11/colorsys.py"]
VOCAB = 448
TARGET = dict(d=64, n_layer=2, n_head=4, n_head_kv=2, ff=96, ctx=160)
# The contract's sizes (examples/llama/README.md), for --contract-size.
CONTRACT_VOCAB = 16000
CONTRACT_TARGET = dict(d=512, n_layer=6, n_head=8, n_head_kv=2, ff=1280, ctx=512)
CONTRACT_DRAFT = dict(d=256, n_layer=2, n_head=4, n_head_kv=2, ff=640, ctx=512)
CONTRACT_TRAINING_DIR = "/usr/lib/python3.11"


def train_tokenizer(out_dir, files=TRAINING_FILES):
    text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in files)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.split("\n\n")), model_writer=model, vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, split_digits=True, remove_extra_whitespaces=False, add_dummy_prefix=False, normalization_rule_name="identity",
        user_defined_symbols=["\n"], unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=1 << 16,
        num_threads=1)
    with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def random_weights(rng, hp):
    d, hd = hp["d"], hp["d"] // hp["n_head"]
    q_dim, kv_dim, ff = hp["n_head"] * hd, hp["n_head_kv"] * hd, hp["ff"]
    def matrix(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float16)
    def norm():
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    w = {"token_embd.weight": (0.35 * rng.standard_normal((VOCAB, d))).astype(np.float16),
         "output_norm.weight": norm()}
    for layer in range(hp["n_layer"]):
        scale = 1.0 if layer == 0 else 0.3  # later blocks nudge the first block's output
        p = f"blk.{layer}."
        w.update({p + "attn_norm.weight": norm(), p + "attn_q.weight": matrix(q_dim, d, 2.0),
                  p + "attn_k.weight": matrix(kv_dim, d, 2.0), p + "attn_v.weight": matrix(kv_dim, d, scale),
                  p + "attn_output.weight": matrix(d, q_dim, scale), p + "ffn_norm.weight": norm(),
                  p + "ffn_gate.weight": matrix(ff, d), p + "ffn_up.weight": matrix(ff, d),
                  p + "ffn_down.weight": matrix(d, ff, scale)})
    return w


def write_model(path, name, hp, weights, dtype=None):
    writer = GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_context_length(hp["ctx"])
    writer.add_embedding_length(hp["d"])
    writer.add_block_count(hp["n_layer"])
    writer.add_feed_forward_length(hp["ff"])
    writer.add_head_count(hp["n_head"])
    writer.add_head_count_kv(hp["n_head_kv"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for tensor_name, value in weights.items():
        writer.add_tensor(tensor_name, value if dtype is None else value.astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def contract_size(out_dir):
    global VOCAB
    VOCAB = CONTRACT_VOCAB
    os.makedirs(os.path.join(out_dir, "prompts"), exist_ok=True)
    files = sorted(os.path.join(CONTRACT_TRAINING_DIR, f) for f in os.listdir(CONTRACT_TRAINING_DIR) if f.endswith(".py"))
    train_tokenizer(out_dir, files)
    rng = np.random.default_rng(512)
    write_model(os.path.join(out_dir, "target.gguf"), "random target", CONTRACT_TARGET, random_weights(rng, CONTRACT_TARGET))
    write_model(os.path.join(out_dir, "draft.gguf"), "random draft", CONTRACT_DRAFT, random_weights(rng, CONTRACT_DRAFT))
    with open(os.path.join(out_dir, "prompts", "textwrap.txt"), "w", encoding="utf-8") as f:
        f.write(open(os.path.join(CONTRACT_TRAINING_DIR, "textwrap.py"), encoding="utf-8").read()[:3000])
    print(f"wrote {out_dir}: random models of the contract's sizes, vocab {VOCAB}")


def fuzz_seeds(out_dir):
    """Tiny models (under libFuzzer's 4096-byte inputs) for tests/fuzz's
    fuzz_gguf: one F16/F32 as the contract writes them, one all F32 with
    two blocks."""
    global VOCAB
    VOCAB = 8
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(4096)
    tiny = dict(d=4, n_layer=1, n_head=2, n_head_kv=1, ff=4, ctx=8)
    write_model(os.path.join(out_dir, "seed-tiny-f16"), "tiny", tiny, random_weights(rng, tiny))
    two = dict(tiny, n_layer=2)
    write_model(os.path.join(out_dir, "seed-two-blocks-f32"), "two blocks", two, random_weights(rng, two), np.float32)
    for name in ("seed-tiny-f16", "seed-two-blocks-f32"):
        size = os.path.getsize(os.path.join(out_dir, name))
        assert size <= 4096, f"{name} is {size} bytes"
    print(f"wrote {out_dir}: 2 seeds")


def main(out_dir):
    os.makedirs(os.path.join(out_dir, "prompts"), exist_ok=True)
    tokenizer = train_tokenizer(out_dir)
    assert tokenizer.vocab_size() == VOCAB
    sample = "def f(x):\n    return x  # 123\n\n\tend\n"
    assert tokenizer.decode(tokenizer.encode(sample)) == sample, "the tokenizer must round-trip code"

    rng = np.random.default_rng(16)
    target = random_weights(rng, TARGET)
    write_model(os.path.join(out_dir, "target.gguf"), "fixture target", TARGET, target)
    draft_hp = dict(TARGET, n_layer=1)
    draft = {k: v for k, v in target.items() if not k.startswith("blk.1.")}
    write_model(os.path.join(out_dir, "draft.gguf"), "fixture draft", draft_hp, draft, np.float32)

    prompt = ("def wrap(text, width=70):\n    lines = []\n    for line in text.split('\\n'):\n"
              "        lines.append(line[:width])\n    return lines\n\n\ndef wrap(text, width=70):\n")
    with open(os.path.join(out_dir, "prompts", "wrap.txt"), "w", encoding="utf-8") as f:
        f.write(prompt)

    tokens = [1] + tokenizer.encode(prompt)
    for name in ("target", "draft"):
        path = os.path.join(out_dir, name + ".gguf")
        reference_forward.write_reference(os.path.join(out_dir, f"reference_{name}.bin"), tokens,
                                          reference_forward.forward(path, tokens))
    print(f"wrote {out_dir}: vocab {VOCAB}, prompt of {len(tokens)} tokens")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--contract-size":
        contract_size(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--fuzz-seeds":
        fuzz_seeds(sys.argv[2])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
