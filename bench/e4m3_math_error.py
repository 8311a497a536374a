"""The relative error that rounding Q and/or the softmax probabilities P to e4m3 costs one decode query, against
float64 attention over the same e4m3 K and V (what XQA's Hopper fp8 kernel does: bench_decode.P_ROUNDOFF). CPU.

    python bench/e4m3_math_error.py     # prints one line per (D, context, seed)
"""
import torch


def attention(q, k, v, scale, round_p):
    s = q @ k.T * scale
    p = torch.exp(s - s.max(-1, keepdim=True).values)
    pr = p.float().to(torch.float8_e4m3fn).double() if round_p else p
    return pr @ v / pr.sum(-1, keepdim=True)


def main():
    print("D ctx seed | Q e4m3 | P e4m3 | Q and P e4m3   (relative Frobenius error, 8 heads)")
    for d in (128, 256):
        for ctx in (1024, 4096, 32768):
            for seed in range(2):
                g = torch.Generator().manual_seed(seed)
                q = torch.randn(8, d, generator=g).bfloat16()
                k, v = (torch.randn(ctx, d, generator=g).bfloat16().to(torch.float8_e4m3fn).double() for _ in "kv")
                q64, q8 = q.double(), q.float().to(torch.float8_e4m3fn).double()
                ref = attention(q64, k, v, 1.0 / d, False)
                err = [((attention(qq, k, v, 1.0 / d, rp) - ref).norm() / ref.norm()).item()
                       for qq, rp in ((q8, False), (q64, True), (q8, True))]
                print(f"{d} {ctx} {seed} | " + " | ".join(f"{e:.4f}" for e in err))


if __name__ == "__main__":
    main()
