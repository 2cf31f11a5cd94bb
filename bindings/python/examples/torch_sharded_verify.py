"""Vocabulary-parallel speculative verify with torch.distributed: one
process per GPU (NCCL), or per CPU rank (gloo) where there are not enough
GPUs.

Each rank holds the rows [begin, end) of the LM head W, as a tensor-parallel
engine's ParallelLMHead does. Per verify step, instead of all-gathering the
[rows, V] fp32 logits, every rank
  1. runs flashspec's fused pass over its slice: ctx.verify_shard writes one
     48-byte record per target row;
  2. all-gathers the records (rows × 48 bytes per rank) with torch.distributed;
  3. runs ctx.finalize_shards on the gathered records: every rank gets the
     tokens the unsharded verify of the whole head would emit.
On the GPU everything runs on torch's current stream: the context is created
on it, and torch orders its collectives with that stream.

    torchrun --nproc-per-node 2 bindings/python/examples/torch_sharded_verify.py
    torchrun --nproc-per-node 2 bindings/python/examples/torch_sharded_verify.py --check

--check also verifies the whole head on rank 0 and requires every rank's
tokens to equal it, step by step (exit status 1 otherwise).
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist

import flashspec


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--drafts", type=int, default=3, help="drafts per request")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="cuda: one GPU per rank over NCCL; cpu: CPU contexts over gloo")
    p.add_argument("--check", action="store_true", help="compare every step with the unsharded verify")
    return p.parse_args()


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available() and torch.cuda.device_count() >= world
        and flashspec.cuda_device_count() >= world)
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dtype = torch.bfloat16 if use_cuda else torch.float32

    # The same weights and hidden rows on every rank (a fixed generator).
    V, d, R, n = args.vocab, args.hidden, args.requests, args.drafts
    gen = torch.Generator().manual_seed(1234)
    W = (torch.randn(V, d, generator=gen) * (3.0 / math.sqrt(d))).to(dtype)
    bounds = [V * k // world for k in range(world + 1)]
    begin, end = bounds[rank], bounds[rank + 1]

    ctx = flashspec.Context("cuda" if use_cuda else "cpu", device=local_rank if use_cuda else 0,
                            cuda_stream=torch.cuda.current_stream() if use_cuda else None, seed=7)
    head = ctx.lm_head_shard(W[begin:end].to(device), begin, V)
    whole = ctx.lm_head(W.to(device)) if args.check and rank == 0 else None

    rows = R * (n + 1)
    offsets = torch.arange(0, R * n + 1, n, dtype=torch.int32, device=device)
    temperatures = torch.tensor([0.0 if r % 4 == 0 else args.temperature for r in range(R)], device=device)
    seeds = torch.arange(R, dtype=torch.int64, device=device)
    local = torch.empty((rows, flashspec.SHARD_RECORD_BYTES), dtype=torch.uint8, device=device)
    gathered = torch.empty((world, rows, flashspec.SHARD_RECORD_BYTES), dtype=torch.uint8, device=device)
    failures = 0
    for step in range(args.steps):
        hidden = torch.randn(rows, d, generator=gen).to(dtype)
        # Drafts: the target's argmax, except any token as every third draft.
        best = (hidden.float() @ W.float().T).argmax(dim=1).to(torch.int32)
        drafts = torch.stack([best[r * (n + 1) + j] if (j + 1) % 3 else torch.tensor((r * 977 + j) % V, dtype=torch.int32)
                              for r in range(R) for j in range(n)]).to(device)
        steps = torch.full((R,), step, dtype=torch.int64, device=device)
        batch = flashspec.VerifyBatch(offsets, drafts, hidden.to(device), temperatures=temperatures,
                                      seeds=seeds, steps=steps)

        ctx.verify_shard(head, batch, local)                   # 1. this rank's slice
        dist.all_gather(list(gathered.unbind(0)), local)       # 2. rows × 48 bytes per rank
        result = ctx.finalize_shards(batch, gathered)          # 3. the tokens, on every rank

        accepted = torch.as_tensor(result.accepted_counts).to("cpu")
        emitted = torch.as_tensor(result.emitted_tokens).to("cpu")
        if args.check:
            want = torch.empty_like(emitted)
            if rank == 0:
                unsharded = ctx.verify_and_finalize(whole, batch)
                want = torch.as_tensor(unsharded.emitted_tokens).to("cpu")
            want = want.to(device)
            dist.broadcast(want, src=0)
            if not torch.equal(want.to("cpu"), emitted):
                failures += 1
                print(f"rank {rank} step {step}: tokens differ from the unsharded verify", file=sys.stderr)
        if rank == 0:
            firsts = [emitted[r * (n + 1): r * (n + 1) + int(accepted[r]) + 1].tolist() for r in range(min(R, 3))]
            print(f"step {step}: {int(accepted.sum())} of {R * n} drafts accepted over {world} ranks; "
                  f"requests 0-2 emitted {firsts}; records exchanged {rows * flashspec.SHARD_RECORD_BYTES} bytes "
                  f"per rank instead of {rows * (V // world) * 4} bytes of logits")
    if args.check:
        total = torch.tensor([failures], device=device)
        dist.all_reduce(total)
        failures = int(total.item())
        if rank == 0:
            print("every rank emitted the unsharded verify's tokens" if failures == 0
                  else f"{failures} rank-step(s) differ from the unsharded verify")
    for h in (head, whole):
        if h is not None:
            h.close()
    ctx.close()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
