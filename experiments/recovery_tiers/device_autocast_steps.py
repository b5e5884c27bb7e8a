"""bf16 autocast against fp32 training steps of a MiniLM-L6-shaped classifier on a CPU with AMX.

Only torch and transformers.

Run as an inline command on the lent GPU machine's CPU (GPU hidden), whose image has torch and
transformers but not this project's other dependencies; its output is results/device_autocast_steps.txt.
The same step the HF Trainer's ``bf16=True`` runs (accelerate's ``torch.autocast("cpu", bfloat16)``
around the forward, fp32 weights, AdamW), timed directly: a fresh optimiser and the same initial
weights for each mode, one untimed step, then the median of 4; modes alternate in order per round.

    CUDA_VISIBLE_DEVICES= python3 experiments/recovery_tiers/device_autocast_steps.py
"""

import statistics as st
import time

import torch
from transformers import BertConfig as C
from transformers import BertForSequenceClassification as B

torch.manual_seed(0)
m = B(C(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, num_labels=2))
s = {k: v.clone() for k, v in m.state_dict().items()}
g = torch.Generator().manual_seed(0)
x = torch.randint(1000, 20000, (32, 64), generator=g)
y = torch.randint(0, 2, (32,), generator=g)
o: torch.optim.Optimizer


def step(bf: bool) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf):
        loss = m(input_ids=x, labels=y).loss
    loss.backward()
    o.step()
    o.zero_grad()
    return float(loss)


for th in (1, 2):
    torch.set_num_threads(th)
    R = []
    for r in range(3):
        T, L = {}, {}
        for md in ((False, True) if r % 2 == 0 else (True, False)):
            m.load_state_dict(s)
            o = torch.optim.AdamW(m.parameters(), lr=5e-5)
            step(md)
            z, L[md] = [], []
            for _ in range(4):
                a = time.perf_counter()
                L[md].append(step(md))
                z.append(time.perf_counter() - a)
            T[md] = st.median(z)
        R.append(T[False] / T[True])
        print("threads", th, "round", r, f"fp32 {T[False]:.3f} bf16 {T[True]:.3f} ratio {R[-1]:.2f}",
              "loss fp32", [f"{v:.4f}" for v in L[False]], "bf16", [f"{v:.4f}" for v in L[True]], flush=True)
    print("threads", th, f"median ratio {st.median(R):.2f}")
