#!/usr/bin/env python3
"""Trains the target and the draft of examples/llama/FORMAT.md on the token
files of prepare.py, each for a wall-clock budget, and writes

  OUT/target.pt, OUT/draft.pt   {"config", "state_dict", "role", ...}: the weights
                                of the evaluation with the lowest validation loss,
                                matrices in float16 and norms in float32 as in GGUF
  OUT/train_log.json            losses, steps, tokens, seconds, device, configs
  OUT/target.gguf, OUT/draft.gguf   only where the `gguf` package is importable;
                                    otherwise export_gguf.py converts later

Usage, from the repository root, on one GPU:
  python3 examples/llama/train/train.py --data .train-data --out .train-out \\
      --target-seconds 100 --draft-seconds 50
CPU smoke run (scaled-down models, context 128):
  python3 examples/llama/train/train.py --data .train-data --out /tmp/smoke \\
      --smoke --target-seconds 40 --draft-seconds 20
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as llama  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train the examples/llama target and draft.")
    p.add_argument("--data", required=True, help="directory with train.bin, val.bin (prepare.py)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--target-seconds", type=float, required=True, help="wall-clock budget of the target")
    p.add_argument("--draft-seconds", type=float, required=True, help="wall-clock budget of the draft")
    p.add_argument("--smoke", action="store_true", help="scaled-down models and batch (CPU test)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 64, smoke 8)")
    p.add_argument("--target-lr", type=float, default=1e-3, help="peak learning rate of the target")
    p.add_argument("--draft-lr", type=float, default=2e-3, help="peak learning rate of the draft")
    p.add_argument("--target-dropout", type=float, default=0.2,
                   help="training dropout of the target (default %(default)s)")
    p.add_argument("--draft-dropout", type=float, default=0.2,
                   help="training dropout of the draft (default %(default)s)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, help="linear warmup steps (default 100, smoke 10)")
    p.add_argument("--eval-every", type=float,
                   help="evaluate after every this fraction of a budget (default 0.05, smoke 0.25)")
    p.add_argument("--eval-windows", type=int, default=0,
                   help="validation windows per evaluation, 0 = all of val.bin (smoke default 16)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="also stop each model after this many steps (0: the time budget alone); "
                        "the schedule then follows whichever limit is nearer")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (optional)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    for name in ("target_seconds", "draft_seconds"):
        if not getattr(args, name) > 0:
            p.error("--%s must be positive" % name.replace("_", "-"))
    if args.batch_size is None:
        args.batch_size = 8 if args.smoke else 64
    if args.warmup_steps is None:
        args.warmup_steps = 10 if args.smoke else 100
    if args.eval_every is None:
        args.eval_every = 0.25 if args.smoke else 0.05
    if args.smoke and args.eval_windows == 0:
        args.eval_windows = 16
    return args


def load_tokens(path, device):
    if not os.path.isfile(path):
        raise SystemExit("train.py: %s is missing (run prepare.py first)" % path)
    tokens = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    return torch.from_numpy(tokens).to(device)


class Batches:
    """Random windows of context+1 tokens from the token stream (held on the
    device, so drawing a batch costs no host work)."""

    def __init__(self, tokens, context, batch_size, generator):
        if tokens.numel() <= context + 1:
            raise SystemExit("train.py: %d tokens is too few for context %d" % (tokens.numel(), context))
        self.tokens, self.context, self.batch_size, self.generator = tokens, context, batch_size, generator
        self.offsets = torch.arange(context + 1, device=tokens.device)

    def next(self):
        starts = torch.randint(0, self.tokens.numel() - self.context - 1, (self.batch_size,),
                               generator=self.generator, device="cpu").to(self.tokens.device)
        windows = self.tokens[starts[:, None] + self.offsets[None, :]]
        return windows[:, :-1], windows[:, 1:]


def fixed_windows(tokens, context, limit):
    """Non-overlapping windows from the start of the stream, the same every
    evaluation: (inputs [N, context], targets [N, context])."""
    n = (tokens.numel() - 1) // context
    if limit:
        n = min(n, limit)
    inputs = tokens[: n * context].view(n, context)
    targets = tokens[1: n * context + 1].view(n, context)
    return inputs, targets


def autocast(device):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def loss_of(model, inputs, targets, device):
    with autocast(device):
        logits = model(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.no_grad()
def evaluate(model, windows, device, batch_size):
    model.eval()
    inputs, targets = windows
    total, count = 0.0, 0
    for i in range(0, inputs.shape[0], batch_size):
        n = inputs[i:i + batch_size].numel()
        total += loss_of(model, inputs[i:i + batch_size], targets[i:i + batch_size], device).item() * n
        count += n
    model.train()
    return total / count


def learning_rate(peak, step, warmup_steps, progress):
    """Linear warmup over the first steps, then cosine decay to peak/10 over
    the wall-clock budget (progress = elapsed / budget). Tying the decay to
    time rather than to a step count estimated up front keeps it matched to
    the budget whatever the speed and the evaluation pauses turn out to be."""
    warm = min(1.0, (step + 1) / warmup_steps)
    decay = 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return peak * warm * decay


def make_optimizer(model, lr, weight_decay, device):
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": weight_decay},
              {"params": vectors, "weight_decay": 0.0}]
    fused = {"fused": True} if device.startswith("cuda") else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **fused)


def train_one(role, cfg, seconds, peak_lr, dropout, args, train_tokens, val_tokens, log):
    device = args.device
    torch.manual_seed(args.seed)
    model = llama.Llama(cfg, dropout).to(device)
    n_params = llama.count_parameters(model)
    step_model = torch.compile(model) if args.compile else model
    optimizer = make_optimizer(model, peak_lr, args.weight_decay, device)
    generator = torch.Generator().manual_seed(args.seed)
    batches = Batches(train_tokens, cfg.context_length, args.batch_size, generator)
    val_windows = fixed_windows(val_tokens, cfg.context_length, args.eval_windows)
    # A fixed sample of training windows, as many as the validation ones, so
    # the two losses are measured alike (the running loss lags the weights).
    train_windows = fixed_windows(train_tokens, cfg.context_length, val_windows[0].shape[0])
    eval_batch = max(1, args.batch_size)
    print("[%s] %d parameters, %s, batch %d x %d, %.0f s" % (
        role, n_params, cfg, args.batch_size, cfg.context_length, seconds), flush=True)

    history = []
    best = {"val_loss": float("inf")}
    step, tokens_seen = 0, 0
    running = None
    next_eval = args.eval_every
    start = time.perf_counter()

    def record(final):
        val_loss = evaluate(model, val_windows, device, eval_batch)
        train_loss = evaluate(model, train_windows, device, eval_batch)
        elapsed = time.perf_counter() - start
        entry = {"step": step, "tokens": tokens_seen, "seconds": round(elapsed, 2),
                 "train_loss": train_loss, "val_loss": val_loss,
                 "running_train_loss": running, "lr": optimizer.param_groups[0]["lr"]}
        history.append(entry)
        print("[%s] step %6d  %6.1f s  tokens %11d  train %.4f  val %.4f  lr %.2e%s" % (
            role, step, elapsed, tokens_seen, train_loss, val_loss, entry["lr"],
            "  (final)" if final else ""), flush=True)
        if val_loss < best["val_loss"]:
            best.update(val_loss=val_loss, train_loss=train_loss, step=step, tokens=tokens_seen,
                        state_dict={k: v.detach().to(llama.storage_dtype(v)).cpu().clone()
                                    for k, v in model.state_dict().items()})

    record(False)
    while True:
        progress = (time.perf_counter() - start) / seconds
        if args.max_steps:
            progress = max(progress, step / args.max_steps)
        if progress >= 1.0:
            break
        lr = learning_rate(peak_lr, step, args.warmup_steps, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = batches.next()
        loss = loss_of(step_model, inputs, targets, device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        tokens_seen += inputs.numel()
        if step % 50 == 0 or step < 50:
            value = loss.item()
            if not math.isfinite(value):
                raise SystemExit("train.py: [%s] loss is %r at step %d" % (role, value, step))
            running = value if running is None else 0.9 * running + 0.1 * value
        if progress >= next_eval:
            record(False)
            next_eval += args.eval_every
    train_seconds = time.perf_counter() - start
    record(True)
    final = history[-1]

    checkpoint = {"role": role, "config": dataclass_dict(cfg), "state_dict": best["state_dict"],
                  "step": best["step"], "tokens": best["tokens"],
                  "val_loss": best["val_loss"], "train_loss": best["train_loss"]}
    path = os.path.join(args.out, role + ".pt")
    torch.save(checkpoint, path)
    log[role] = {
        "config": dataclass_dict(cfg), "parameters": n_params,
        "steps": step, "tokens_seen": tokens_seen, "seconds": round(train_seconds, 2),
        "tokens_per_second": round(tokens_seen / train_seconds),
        "final_train_loss": final["train_loss"], "final_val_loss": final["val_loss"],
        "checkpoint": {"path": os.path.basename(path), "step": best["step"], "tokens": best["tokens"],
                       "train_loss": best["train_loss"], "val_loss": best["val_loss"],
                       "why": "the evaluation with the lowest validation loss"},
        "peak_lr": peak_lr, "dropout": dropout, "history": history,
    }
    if device.startswith("cuda"):
        log[role]["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(device)
    print("[%s] done: %d steps, %d tokens in %.1f s; final train %.4f val %.4f; "
          "checkpoint from step %d (val %.4f) -> %s" % (
              role, step, tokens_seen, train_seconds, final["train_loss"], final["val_loss"],
              best["step"], best["val_loss"], path), flush=True)
    return path


def dataclass_dict(cfg):
    return dataclasses.asdict(cfg)


def export_if_possible(paths, out_dir):
    try:
        import gguf  # noqa: F401
    except ImportError:
        print("gguf is not importable here: convert later with\n" + "\n".join(
            "  python3 examples/llama/train/export_gguf.py %s examples/llama/models/%s.gguf" % (
                path, os.path.splitext(os.path.basename(path))[0]) for path in paths), flush=True)
        return []
    import export_gguf
    written = []
    for path in paths:
        cfg, state_dict, checkpoint = export_gguf.load_checkpoint(path)
        gguf_path = os.path.join(out_dir, checkpoint["role"] + ".gguf")
        export_gguf.write_gguf(gguf_path, cfg, state_dict, "flashspec-llama-" + checkpoint["role"])
        print("wrote %s" % gguf_path, flush=True)
        written.append(gguf_path)
    return written


def main(argv=None):
    args = parse_args(argv)
    wall_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        device_name = torch.cuda.get_device_name(torch.device(args.device))
    else:
        device_name = "cpu (%d threads)" % torch.get_num_threads()
    train_tokens = load_tokens(os.path.join(args.data, "train.bin"), args.device)
    val_tokens = load_tokens(os.path.join(args.data, "val.bin"), args.device)
    target_cfg, draft_cfg = (llama.SMOKE_TARGET, llama.SMOKE_DRAFT) if args.smoke else (llama.TARGET, llama.DRAFT)
    log = {"device": device_name, "torch": torch.__version__, "smoke": args.smoke,
           "batch_size": args.batch_size, "weight_decay": args.weight_decay,
           "warmup_steps": args.warmup_steps, "compile": args.compile, "seed": args.seed,
           "data": {"train_tokens": int(train_tokens.numel()), "val_tokens": int(val_tokens.numel())}}
    data_json = os.path.join(args.data, "data.json")
    if os.path.isfile(data_json):
        with open(data_json) as f:
            log["data"]["prepare"] = json.load(f)
    paths = [train_one("target", target_cfg, args.target_seconds, args.target_lr, args.target_dropout,
                       args, train_tokens, val_tokens, log),
             train_one("draft", draft_cfg, args.draft_seconds, args.draft_lr, args.draft_dropout,
                       args, train_tokens, val_tokens, log)]
    log["gguf"] = [os.path.basename(p) for p in export_if_possible(paths, args.out)]
    log["total_seconds"] = round(time.perf_counter() - wall_start, 2)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=2)
        f.write("\n")
    print("total %.1f s; log in %s" % (log["total_seconds"], os.path.join(args.out, "train_log.json")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
