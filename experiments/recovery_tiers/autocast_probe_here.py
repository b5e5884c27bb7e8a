"""One training step (forward and backward) of minilm-l6 at batch 32 x 64, fp32 against bf16 autocast, alternating.

The probe that showed this session's shared CPU (AMD EPYC family 25, flags avx avx2 fma: no AVX-512, no
bf16 instructions) runs bf16 autocast training many times slower than fp32: PyTorch has no native bf16
products here (``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is False, CPU capability AVX2), which is
why ``surgery.compress.training_tier.bf16_training`` keeps training in fp32 on such a CPU. Output:
results/autocast_probe_here.txt.

    nice python experiments/recovery_tiers/autocast_probe_here.py
"""

import time

import torch

import surgery

torch.set_num_threads(1)
m = surgery.from_pretrained("minilm-l6", model_class="AutoModelForSequenceClassification", num_labels=2,
                            allow_new_head=True)
m.train()
x = torch.randint(1000, 20000, (32, 64))
y = torch.randint(0, 2, (32,))
for mode in ["fp32", "bf16", "fp32", "bf16"]:
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
        out = m(input_ids=x, labels=y)
    out.loss.backward()
    print(mode, time.perf_counter() - t, flush=True)
