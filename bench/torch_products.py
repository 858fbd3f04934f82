"""G1-G3 on the GPU: torch eager and torch.compile beside cuBLAS's plain products, one run (docs/performance-gpu.md)."""
import json, os, sys, time
import torch
import torch.nn.functional as F
from triton.testing import do_bench
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
def bench(fn, *a):
    return do_bench(lambda: fn(*a), warmup=25, rep=200, return_mode="median")
rows = []
def row(name, fn, args, plain):
    torch._dynamo.reset()
    r = {"name": name, "eager_ms": bench(fn, *args), "plain_ms": sum(bench(p, *pa) for p, pa in plain)}
    c = torch.compile(fn, dynamic=False)
    torch.cuda.synchronize(); t0 = time.perf_counter(); c(*args); torch.cuda.synchronize()
    r["compile_s"] = time.perf_counter() - t0
    r["compiled_ms"] = bench(c, *args)
    rows.append(r)
    print(f"{name:28s} eager {r['eager_ms']:.4f} compiled {r['compiled_ms']:.4f} plain mm {r['plain_ms']:.4f} ms (compile {r['compile_s']:.1f}s)", flush=True)
n = 4096
for dt, name in ((torch.bfloat16, "G1 bf16"), (torch.float32, "G2 f32")):
    A = torch.randn(n, n, device=dev, dtype=dt) * 0.02; W = torch.randn(n, n, device=dev, dtype=dt) * 0.02
    b = torch.randn(n, device=dev, dtype=dt) * 0.02
    row(name + " relu(A@W+b)", lambda A, W, b: torch.relu(A @ W + b), (A, W, b), [(torch.mm, (A, W))])
x = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
W1 = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16) * 0.02; b1 = torch.randn(16384, device=dev, dtype=torch.bfloat16) * 0.02
W2 = torch.randn(4096, 16384, device=dev, dtype=torch.bfloat16) * 0.02; b2 = torch.randn(4096, device=dev, dtype=torch.bfloat16) * 0.02
h = torch.randn(8192, 16384, device=dev, dtype=torch.bfloat16)
row("G3 MLP bf16", lambda x, W1, b1, W2, b2: F.linear(F.gelu(F.linear(x, W1, b1), approximate="tanh"), W2, b2),
    (x, W1, b1, W2, b2), [(lambda x, w: x @ w.t(), (x, W1)), (lambda h, w: h @ w.t(), (h, W2))])
# G4: two small MLP layers (x [32, 1024] bf16, hidden 4096), end to end per call (call + synchronise),
# torch.compile in its default mode and with CUDA graphs (reduce-overhead), as bench_gpu's BM_G4_compiled.
def wall_us(fn, *a, reps=200):
    for _ in range(20): fn(*a); torch.cuda.synchronize()
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps): fn(*a); torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) / reps * 1e6)
    return sorted(t)[2]
xs = torch.randn(32, 1024, device=dev, dtype=torch.bfloat16)
ps = []
for _ in range(2):
    ps += [torch.randn(4096, 1024, device=dev, dtype=torch.bfloat16) * 0.02, torch.randn(4096, device=dev, dtype=torch.bfloat16) * 0.02,
           torch.randn(1024, 4096, device=dev, dtype=torch.bfloat16) * 0.02, torch.randn(1024, device=dev, dtype=torch.bfloat16) * 0.02]
def mlp2(h, w1, b1, w2, b2, w3, b3, w4, b4):
    h = h + F.linear(F.gelu(F.linear(h, w1, b1), approximate="tanh"), w2, b2)
    return h + F.linear(F.gelu(F.linear(h, w3, b3), approximate="tanh"), w4, b4)
g4 = {"name": "G4 small MLP end to end", "eager_us": wall_us(mlp2, xs, *ps)}
for mode in ("default", "reduce-overhead"):
    torch._dynamo.reset()
    g4[mode + "_us"] = wall_us(torch.compile(mlp2, mode=mode, dynamic=False), xs, *ps)
rows.append(g4)
print(f"G4 small MLP end to end: eager {g4['eager_us']:.1f} us, compiled {g4['default_us']:.1f} us, reduce-overhead {g4['reduce-overhead_us']:.1f} us", flush=True)
out = os.environ.get("OUT")
if out:
    json.dump(rows, open(os.path.join(out, "torch_g.json"), "w"), indent=1)
