"""The ``lossless`` tier's fused ops: each a reference chain and its kernels, run only for call signatures where the
kernel matched the reference bit for bit on first sight (:mod:`.verify`); one module per op in :mod:`.ops`, what
their CPU and Triton kernels share in :mod:`.kernels`."""
