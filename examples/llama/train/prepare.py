#!/usr/bin/env python3
"""Builds the training corpus, the tokenizer and the token files of the
examples/llama model pair (see examples/llama/FORMAT.md).

From the Python standard library sources that Debian ships
(/usr/lib/python3.11, package libpython3.11-stdlib) it writes:

  examples/llama/models/corpus_files.txt   the data list (every file, its role)
  examples/llama/models/tokenizer.model    SentencePiece BPE, 16000 pieces
  examples/llama/models/prompts/*.txt      openings of held-out files
  OUT/train.bin, OUT/val.bin               flat little-endian uint16 token ids,
                                           each file as bos + tokens + eos
  OUT/data.json                            counts and checksums

The output is a function of the stdlib files alone: files are taken in sorted
order, the held-out set is fixed by rule, and the tokenizer is trained on the
training files without sampling.

Usage (from the repository root):
  python3 examples/llama/train/prepare.py --out .train-data
"""
import argparse
import hashlib
import io
import json
import os
import sys

import numpy as np
import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.normpath(os.path.join(HERE, "..", "models"))
DEFAULT_STDLIB = "/usr/lib/python3.11"

VOCAB_SIZE = 16000
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# Directories left out of the corpus: the regression-test support package,
# IDLE, lib2to3's test data, third-party packages, the build configuration
# and bytecode caches.
EXCLUDED_DIRS = ("test/", "idlelib/", "lib2to3/tests/", "site-packages/",
                 "dist-packages/", "__pycache__/", "config-3.11-")
# Single files left out: pydoc's topic index is 750 kB of documentation prose
# held in one generated string literal, not code; it alone would be 7% of the
# corpus.
EXCLUDED_FILES = ("pydoc_data/topics.py",)

# Held-out files whose openings become the prompts (each also in val.bin).
PROMPT_FILES = ("bisect.py", "fractions.py", "json/encoder.py", "queue.py")
PROMPT_LINES = 30
# Besides the prompt files, every VAL_STRIDE-th of the remaining files (in
# sorted order, starting with the first) is held out for the validation loss.
VAL_STRIDE = 25


def list_python_files(stdlib_root):
    paths = []
    for dirpath, dirnames, filenames in os.walk(stdlib_root):
        dirnames.sort()
        for name in filenames:
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                paths.append(os.path.relpath(full, stdlib_root).replace(os.sep, "/"))
    return sorted(paths)


def exclusion_reason(rel_path):
    for prefix in EXCLUDED_DIRS:
        if rel_path.startswith(prefix) or ("/" + prefix) in ("/" + rel_path):
            return "directory " + prefix
    if rel_path in EXCLUDED_FILES:
        return "generated documentation string"
    return None


def assign_roles(all_paths):
    """Returns [(path, role)] with role 'train', 'heldout' or 'excluded'."""
    roles = []
    kept = []
    for path in all_paths:
        if exclusion_reason(path):
            roles.append((path, "excluded"))
        else:
            kept.append(path)
    missing = [p for p in PROMPT_FILES if p not in kept]
    if missing:
        raise SystemExit("prepare.py: prompt files missing from the stdlib: %s" % ", ".join(missing))
    others = [p for p in kept if p not in PROMPT_FILES]
    stride_heldout = set(others[::VAL_STRIDE])
    for path in kept:
        held = path in PROMPT_FILES or path in stride_heldout
        roles.append((path, "heldout" if held else "train"))
    return sorted(roles)


def read_text(stdlib_root, rel_path):
    with open(os.path.join(stdlib_root, rel_path), "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit("prepare.py: %s is not UTF-8: %s" % (rel_path, e))


def write_data_list(path, stdlib_root, roles):
    counts = {r: sum(1 for _, role in roles if role == r) for r in ("train", "heldout", "excluded")}
    with open(path, "w", encoding="utf-8") as f:
        f.write("# The files of the examples/llama corpus, relative to %s\n" % stdlib_root)
        f.write("# (Debian 12 package libpython3.11-stdlib), written by examples/llama/train/prepare.py.\n")
        f.write("# Columns: role, path. train: in train.bin and the tokenizer's training text;\n")
        f.write("# heldout: in val.bin only (the prompts come from these); excluded: not used\n")
        f.write("# (directories %s; %s).\n" % (", ".join(EXCLUDED_DIRS), ", ".join(EXCLUDED_FILES)))
        f.write("# train %d, heldout %d, excluded %d\n" % (counts["train"], counts["heldout"], counts["excluded"]))
        for rel_path, role in roles:
            f.write("%s\t%s\n" % (role, rel_path))


def lines_with_ends(text):
    """The lines of text, each with its "\n" (str.splitlines would also cut
    at form feeds and other Unicode line breaks)."""
    lines = text.split("\n")
    for line in lines[:-1]:
        yield line + "\n"
    if lines[-1]:
        yield lines[-1]


def train_tokenizer(texts, model_path):
    """Trains the SentencePiece BPE model on the training files.

    Each line (with its newline) is one training sentence: "\\n" is a
    user-defined symbol, which is always a piece of its own, so no piece can
    cross a line end and splitting at line ends loses nothing."""
    def sentences():
        for text in texts:
            yield from lines_with_ends(text)

    # The model goes through model_writer, not model_prefix: the trainer
    # spec saved in the file then holds no output path, so the file is the
    # same wherever it is written.
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences(),
        model_writer=model_bytes,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        character_coverage=0.9995,
        byte_fallback=True,
        split_digits=True,
        # Code: keep every space as written and learn indentation runs as pieces.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=["\n"],
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1,
        max_sentence_length=1 << 16,
        # Saved in the model file: fixed, so the file does not depend on the machine.
        num_threads=2,
        minloglevel=2,
    )
    with open(model_path, "wb") as f:
        f.write(model_bytes.getvalue())


def tokenize_files(sp, texts):
    ids = []
    for text in texts:
        ids.append(BOS_ID)
        ids.extend(sp.encode(text))
        ids.append(EOS_ID)
    array = np.asarray(ids, dtype=np.uint16)
    assert int(array.max()) < VOCAB_SIZE
    return array


def check_round_trip(sp, named_texts):
    for rel_path, text in named_texts:
        decoded = sp.decode(sp.encode(text))
        if decoded != text:
            raise SystemExit("prepare.py: the tokenizer does not round-trip %s" % rel_path)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for train.bin, val.bin, data.json")
    parser.add_argument("--stdlib", default=DEFAULT_STDLIB, help="stdlib root (default %(default)s)")
    parser.add_argument("--models", default=MODELS_DIR,
                        help="directory for tokenizer.model, corpus_files.txt, prompts/ (default %(default)s)")
    args = parser.parse_args(argv)

    if not os.path.isdir(args.stdlib):
        raise SystemExit("prepare.py: --stdlib %s is not a directory (install libpython3.11-stdlib)" % args.stdlib)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(os.path.join(args.models, "prompts"), exist_ok=True)

    roles = assign_roles(list_python_files(args.stdlib))
    write_data_list(os.path.join(args.models, "corpus_files.txt"), args.stdlib, roles)
    train_paths = [p for p, r in roles if r == "train"]
    heldout_paths = [p for p, r in roles if r == "heldout"]
    train_texts = [read_text(args.stdlib, p) for p in train_paths]
    heldout_texts = [read_text(args.stdlib, p) for p in heldout_paths]

    model_path = os.path.join(args.models, "tokenizer.model")
    train_tokenizer(train_texts, model_path)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    assert sp.get_piece_size() == VOCAB_SIZE
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (UNK_ID, BOS_ID, EOS_ID, -1)
    # Held-out text was never seen by the trainer: the real test of exactness.
    check_round_trip(sp, zip(heldout_paths, heldout_texts))
    check_round_trip(sp, zip(train_paths, train_texts))

    train_ids = tokenize_files(sp, train_texts)
    val_ids = tokenize_files(sp, heldout_texts)
    train_ids.tofile(os.path.join(args.out, "train.bin"))
    val_ids.tofile(os.path.join(args.out, "val.bin"))

    for rel_path in PROMPT_FILES:
        text = read_text(args.stdlib, rel_path)
        opening = "".join(list(lines_with_ends(text))[:PROMPT_LINES])
        name = rel_path[:-len(".py")].replace("/", "_") + ".txt"
        with open(os.path.join(args.models, "prompts", name), "w", encoding="utf-8") as f:
            f.write(opening)

    summary = {
        "stdlib": args.stdlib,
        "files": {"train": len(train_paths), "heldout": len(heldout_paths),
                  "excluded": sum(1 for _, r in roles if r == "excluded")},
        "bytes": {"train": sum(len(t.encode("utf-8")) for t in train_texts),
                  "heldout": sum(len(t.encode("utf-8")) for t in heldout_texts)},
        "tokens": {"train": int(train_ids.size), "val": int(val_ids.size)},
        "vocab_size": VOCAB_SIZE,
        "bos_id": BOS_ID, "eos_id": EOS_ID,
        "dtype": "uint16",
        "document_layout": "bos + tokens + eos per file, files in sorted path order",
        "sha256": {"tokenizer.model": sha256_of(model_path),
                   "train.bin": sha256_of(os.path.join(args.out, "train.bin")),
                   "val.bin": sha256_of(os.path.join(args.out, "val.bin"))},
    }
    with open(os.path.join(args.out, "data.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print("files: train %d, held out %d, excluded %d" % (
        summary["files"]["train"], summary["files"]["heldout"], summary["files"]["excluded"]))
    print("tokens: train %d, val %d (%.2f bytes/token on train)" % (
        train_ids.size, val_ids.size, summary["bytes"]["train"] / train_ids.size))
    print("tokenizer round-trips all %d held-out and %d training files exactly" % (
        len(heldout_paths), len(train_paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
