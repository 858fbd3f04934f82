# The result dtype of each op under torch.autocast('cuda') (float16 and bfloat16), for float32 and
# float16 inputs (a float32 operand beside them where an op takes two): one line `op autocast_dtype
# input_dtype result_dtype` (ERR where torch refuses). It needs a CUDA device; its kiln twin is
# autocast_kiln.cpp, whose lines are compared with `diff` (docs/fuzzing.md, "Autocast").
import torch, sys
F = torch.nn.functional
dev = 'cuda'
def ops(x, y, v, t, c, lab):
    return {
     'matmul': lambda: x @ y, 'linear': lambda: F.linear(x, y, v), 'addmm': lambda: torch.addmm(v, x, y), 'mm': lambda: torch.mm(x, y),
     'bmm': lambda: torch.bmm(x[None], y[None]), 'einsum': lambda: torch.einsum('ij,jk->ik', x, y),
     'sdpa': lambda: F.scaled_dot_product_attention(x[None, None], y[None, None], x[None, None]),
     'tensordot': lambda: torch.tensordot(x, y, 1), 'outer': lambda: torch.outer(v, v), 'dot': lambda: torch.dot(v, v),
     'kron': lambda: torch.kron(x, y), 'cdist': lambda: torch.cdist(x, y), 'dist': lambda: torch.dist(x, y), 'pdist': lambda: F.pdist(x),
     'exp': lambda: torch.exp(x), 'log10': lambda: torch.log10(x), 'erfinv': lambda: torch.erfinv(x / 10), 'softplus': lambda: F.softplus(x),
     'sqrt': lambda: torch.sqrt(x), 'sin': lambda: torch.sin(x), 'lgamma': lambda: torch.lgamma(x), 'digamma': lambda: torch.digamma(x),
     'erfc': lambda: torch.erfc(x), 'sigmoid': lambda: torch.sigmoid(x),
     'sum': lambda: x.sum(), 'mean': lambda: x.mean(), 'prod': lambda: x.prod(), 'cumsum': lambda: x.cumsum(0), 'std': lambda: x.std(),
     'var': lambda: x.var(), 'logsumexp': lambda: torch.logsumexp(x, 0), 'softmax': lambda: F.softmax(x, 0), 'log_softmax': lambda: F.log_softmax(x, 0),
     'softmin': lambda: F.softmin(x, 0),
     'vector_norm': lambda: torch.linalg.vector_norm(x), 'norm': lambda: torch.norm(x), 'normalize': lambda: F.normalize(x),
     'layer_norm': lambda: F.layer_norm(x, (4,)), 'rms_norm': lambda: F.rms_norm(x, (4,)), 'cosine_similarity': lambda: F.cosine_similarity(x, y),
     'pairwise_distance': lambda: F.pairwise_distance(x, y),
     'mse_loss': lambda: F.mse_loss(x, y), 'l1_loss': lambda: F.l1_loss(x, y), 'smooth_l1_loss': lambda: F.smooth_l1_loss(x, y),
     'huber_loss': lambda: F.huber_loss(x, y), 'bce_logits': lambda: F.binary_cross_entropy_with_logits(x, torch.sigmoid(y)),
     'kl_div': lambda: F.kl_div(x, y), 'margin_ranking_loss': lambda: F.margin_ranking_loss(v, v * 2, t),
     'soft_margin_loss': lambda: F.soft_margin_loss(x, torch.sign(y)), 'hinge_embedding_loss': lambda: F.hinge_embedding_loss(x, torch.sign(y)),
     'poisson_nll_loss': lambda: F.poisson_nll_loss(x, y.abs()), 'gaussian_nll_loss': lambda: F.gaussian_nll_loss(x, y, y.abs() + 1),
     'cosine_embedding_loss': lambda: F.cosine_embedding_loss(x, y, t), 'triplet_margin_loss': lambda: F.triplet_margin_loss(x, y, x * 2),
     'multilabel_soft_margin_loss': lambda: F.multilabel_soft_margin_loss(x, (y > 0).to(x.dtype)), 'multi_margin_loss': lambda: F.multi_margin_loss(x, lab),
     'cross_entropy': lambda: F.cross_entropy(x, lab), 'nll_loss': lambda: F.nll_loss(x, lab),
     'addcmul': lambda: torch.addcmul(x, y, c), 'addcdiv': lambda: torch.addcdiv(x, y, c + 3), 'atan2': lambda: torch.atan2(x, c),
     'cat': lambda: torch.cat([x, c]), 'stack': lambda: torch.stack([x, c]), 'scatter_add': lambda: x.scatter_add(0, lab[None].expand(4, 4), c),
     'cross': lambda: torch.linalg.cross(x[:, :3], c[:, :3]), 'index_put': lambda: x.index_put((lab,), c[0]),
     'pow': lambda: torch.pow(x, 2.5), 'rpow': lambda: torch.pow(2.0, x), 'div_num': lambda: 2.0 / x, 'square': lambda: torch.square(x),
     'gelu': lambda: F.gelu(x), 'silu': lambda: F.silu(x), 'mul': lambda: x * c, 'add_mixed': lambda: x + c,
     'logaddexp': lambda: torch.logaddexp(x, y), 'xlogy': lambda: torch.xlogy(x, y.abs()), 'lerp': lambda: torch.lerp(x, y, 0.3),
     'cumprod': lambda: x.cumprod(0), 'logcumsumexp': lambda: x.logcumsumexp(0), 'trace': lambda: torch.trace(x), 'diff': lambda: torch.diff(x),
     'cov': lambda: torch.cov(x), 'quantile': lambda: torch.quantile(x, 0.5), 'median': lambda: x.median(),
    }
rows = []
for adt in ['float16', 'bfloat16']:
    for idt in ['float32', 'float16']:
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(4, 4, generator=g) + 0.5).to(dev, getattr(torch, idt)); y = (torch.rand(4, 4, generator=g) + 0.5).to(dev, getattr(torch, idt))
        v = torch.rand(4, generator=g).to(dev, getattr(torch, idt)); t = torch.tensor([1., -1., 1., -1.], device=dev, dtype=getattr(torch, idt))
        c = (torch.rand(4, 4, generator=g) + 0.5).to(dev, torch.float32)   # a float32 operand beside
        lab = torch.tensor([0, 3, 1, 2], device=dev)
        for name, f in ops(x, y, v, t, c, lab).items():
            try:
                with torch.autocast('cuda', dtype=getattr(torch, adt)):
                    r = f()
                r = r[0] if isinstance(r, tuple) else r
                rows.append('%s %s %s %s' % (name, adt, idt, str(r.dtype).split('.')[1]))
            except Exception as e:
                rows.append('%s %s %s ERR' % (name, adt, idt))
print('\n'.join(rows))
