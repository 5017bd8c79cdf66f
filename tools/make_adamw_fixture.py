#!/usr/bin/python3
"""Writes tests/data/adamw_ref.txt: three steps of torch.optim.AdamW + clip_grad_norm_ on a tiny model (a decayed
matrix and an undecayed bias) with a learning-rate schedule, for tests/test_adamw.cpp. Run with Debian's
/usr/bin/python3 (python3-torch) from the repository root."""
import torch

BETAS, EPS, WD, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0
LRS = [1e-2, 2e-2, 5e-3]
GRAD_SCALES = [3.0, 0.05, 2.0]  # steps 1 and 3 are clipped, step 2 is not


def row(xs):
    return " ".join("%.9g" % x for x in xs)


def main():
    torch.manual_seed(1234)
    w = torch.nn.Parameter(torch.randn(5, 7))
    b = torch.nn.Parameter(torch.randn(7) * 0.5)
    params = [w, b]
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": WD}, {"params": [b], "weight_decay": 0.0}],
                            lr=LRS[0], betas=BETAS, eps=EPS)
    flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts]).tolist()
    lines = [
        "# torch %s: AdamW + clip_grad_norm_; sizes = decayed, undecayed values, by tools/make_adamw_fixture.py"
        % torch.__version__,
        "hyper %.9g %.9g %.9g %.9g %.9g" % (BETAS[0], BETAS[1], EPS, WD, CLIP),
        "sizes %d %d" % (w.numel(), b.numel()),
        "init " + row(flat(params)),
    ]
    for lr, scale in zip(LRS, GRAD_SCALES):
        grads = [torch.randn_like(w) * scale, torch.randn_like(b) * scale]
        lines.append("grad %.9g " % lr + row(flat(grads)))
        w.grad, b.grad = grads[0].clone(), grads[1].clone()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        lines.append("norm %.9g" % norm.item())
    lines.append("final " + row(flat(params)))
    with open("tests/data/adamw_ref.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
