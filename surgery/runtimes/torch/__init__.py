"""The PyTorch runtimes (``torch``, ``torch-bf16``, ``torch-fp16``): the model as it is, or a half-precision copy
that answers in fp32 (:mod:`surgery.runtimes.torch.half_precision`)."""
