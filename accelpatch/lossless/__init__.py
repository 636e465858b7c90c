"""The ``lossless`` tier's fused ops: each a reference chain and its kernels, run only for call signatures where the
kernel matched the reference bit for bit on first sight (:mod:`.verify`); the ops themselves are in :mod:`.ops`,
their CPU and Triton kernels in :mod:`.kernels`."""
