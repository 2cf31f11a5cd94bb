#!/usr/bin/env python3
"""Writes a checkpoint of train.py (target.pt or draft.pt) as a GGUF file of
examples/llama/FORMAT.md: arch "llama", llama.cpp tensor names, matrices in
F16, norm weights in F32, tied embeddings (no output.weight).

Runs without a GPU (the checkpoint is loaded onto the CPU). Usage, from the
repository root:
  python3 examples/llama/train/export_gguf.py OUT/target.pt examples/llama/models/target.gguf
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ModelConfig, gguf_tensor_names, storage_dtype  # noqa: E402

BOS_ID, EOS_ID = 1, 2


def load_checkpoint(path):
    """-> (ModelConfig, {parameter name: float32 CPU tensor}, checkpoint dict)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    cfg = ModelConfig(**checkpoint["config"]).validate()
    return cfg, checkpoint["state_dict"], checkpoint


def write_gguf(path, cfg, state_dict, name, matrix_dtype=np.float16):
    """matrix_dtype float16 stores each tensor as model.storage_dtype says;
    float32 stores every tensor in F32."""
    import gguf  # imported here: train.py runs without it and exports later

    names = gguf_tensor_names(cfg)
    if set(names) != set(state_dict):
        raise ValueError("checkpoint parameters %s do not match the model's %s"
                         % (sorted(set(state_dict) ^ set(names)), cfg))
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    for torch_name, gguf_name in names.items():
        tensor = state_dict[torch_name].detach().cpu()
        if matrix_dtype == np.float32:
            array = tensor.to(torch.float32).numpy()
        else:
            array = tensor.to(storage_dtype(tensor)).numpy()
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description="Export a train.py checkpoint to GGUF (examples/llama/FORMAT.md).")
    parser.add_argument("checkpoint", help="target.pt or draft.pt written by train.py")
    parser.add_argument("output", help="the .gguf file to write")
    parser.add_argument("--name", help="general.name (default: the checkpoint's role, e.g. flashspec-llama-target)")
    parser.add_argument("--f32", action="store_true", help="store matrices in F32 instead of F16")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        parser.error("checkpoint %s does not exist" % args.checkpoint)
    cfg, state_dict, checkpoint = load_checkpoint(args.checkpoint)
    name = args.name or "flashspec-llama-" + checkpoint.get("role", "model")
    write_gguf(args.output, cfg, state_dict, name, np.float32 if args.f32 else np.float16)
    print("wrote %s (%s, %d bytes)" % (args.output, name, os.path.getsize(args.output)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
