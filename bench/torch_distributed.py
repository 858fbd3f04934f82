"""The peer of bench_distributed (run with torchrun on the same machine, in the same command):

    torchrun --standalone --nproc-per-node 2 bench/torch_distributed.py          # D1 and D2

D1: torch.distributed's all_reduce (NCCL) of 256 MiB float32, timed with CUDA events, reported
as nccl-tests does (algbw = bytes / time, busbw = algbw * 2 (n - 1) / n).
D2: T1's GPT step (6 layers, d 768, 12 heads, T 1024, batch 16 a rank, bf16 autocast, fused
AdamW) under torch.compile and DistributedDataParallel; tokens/s over every rank.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def d1_all_reduce(rank, world):
    t = torch.ones((256 << 20) // 4, dtype=torch.float32, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        dist.all_reduce(t)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    algbw = t.numel() * 4 / (ms * 1e-3) / 1e9
    if rank == 0:
        print(f"torch D1_all_reduce/256MiB ranks={world} time={ms:.3f} ms algbw={algbw:.1f} GB/s "
              f"busbw={algbw * 2 * (world - 1) / world:.1f} GB/s", flush=True)


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, vocab=50304, block=1024, d=768, layers=6, heads=12):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(d)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def d2_gpt_step_ddp(rank, world):
    torch.manual_seed(0)
    model = Gpt().cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    step_model = torch.compile(ddp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    idx = torch.randint(0, 50304, (16, 1024), device="cuda", generator=g)
    tgt = torch.randint(0, 50304, (16, 1024), device="cuda", generator=g)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 10
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    if rank == 0:
        print(f"torch D2_gpt_step_ddp ranks={world} {ms:.2f} ms/step tokens/s={16 * 1024 * world / (ms * 1e-3):.0f} "
              f"first step {first:.1f} s", flush=True)


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    which = sys.argv[1:] or ["d1", "d2"]
    if "d1" in which:
        d1_all_reduce(rank, world)
    if "d2" in which:
        d2_gpt_step_ddp(rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
