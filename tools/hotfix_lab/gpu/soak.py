"""A soak: N real optimizer steps (AdamW) of one variant; per-step loss, CUDA peak, allocated and host RSS.

    python -P -m hotfix_lab.gpu.soak --mode unsloth --zoo DIR --steps 80 --batch 8      (hotfix on, as installed)
    HOTFIX_DISABLE=1 python -P -m hotfix_lab.gpu.soak --mode non-reentrant --steps 80 --batch 8

What a few steps on unchanged weights cannot show: buffers that grow step after step (host
RSS, CUDA allocated), a peak that creeps, and a loss curve that drifts away from the
workaround's (tools/hotfix_lab/gpu/report.py sets each run's curve beside the non-reentrant run's).
Model and batch as tools/hotfix_lab/gpu/whisper_steps.py builds them (large-v3 dims, bf16, LoRA r=64
by default); one batch, reused every step.  Prints one JSON line: the per-step rows and
the growth figures (step 1 onwards: step 0 includes the allocator's and the optimizer's
first allocations).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hotfix_lab.gpu import whisper_steps as ws  # (the model, batch, checkpointing modes and zoo loading)


def host_rss():
    """This process's resident set now, bytes (Linux /proc)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("non-reentrant", "unsloth", "hf-offload", "none"), required=True)
    p.add_argument("--zoo", default=None)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dims", choices=sorted(ws.DIMS), default="large-v3")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--lr", type=float, default=1e-4)
    a = p.parse_args(argv)
    args = argparse.Namespace(mode=a.mode, zoo=a.zoo, dims=a.dims, dtype=a.dtype, device=a.device, lora=a.lora,
                              lora_scope="all", labels=ws.LABEL_TOKENS)
    import torch
    import transformers  # the start-up hook activates hotfix here (unless HOTFIX_DISABLE=1)

    from hotfix.diagnostics.compare import short_error

    cuda = a.device == "cuda"
    out = {"mode": a.mode, "zoo": a.zoo and os.path.basename(a.zoo.rstrip("/")), "batch": a.batch, "dims": a.dims,
           "dtype": a.dtype, "lora": a.lora, "hotfix": os.environ.get("HOTFIX_DISABLE") != "1",
           "transformers": transformers.__version__, "torch": torch.__version__}
    rows = []
    try:
        if a.mode == "unsloth":
            ws.load_zoo(args, torch)
        model, mels, frames, vocab = ws.build(args, torch)
        ws.enable(model, args)
        optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=a.lr)
        batch = ws.batch_of(a.batch, mels, frames, vocab, args, torch)
        for step in range(a.steps):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            rows.append(dict(step=step, loss=loss.item(), seconds=round(time.perf_counter() - t0, 4),
                             peak=torch.cuda.max_memory_allocated() if cuda else None,
                             allocated=torch.cuda.memory_allocated() if cuda else None, rss=host_rss()))
        out["status"] = "ok"
    except Exception as exc:
        out.update(status="crash", error=short_error(exc))
    out["steps"] = rows
    steady = rows[1:]
    if len(steady) > 1:
        def growth(key):
            return None if steady[0][key] is None else steady[-1][key] - steady[0][key]

        peaks = [r["peak"] for r in steady if r["peak"] is not None]
        out.update(rss_growth=growth("rss"), allocated_growth=growth("allocated"),
                   peak_spread=(max(peaks) - min(peaks)) if peaks else None, peak_max=max(peaks) if peaks else None,
                   median_s=sorted(r["seconds"] for r in steady)[len(steady) // 2],
                   first_loss=rows[0]["loss"], last_loss=rows[-1]["loss"])
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
