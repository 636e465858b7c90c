"""What the lossless fused ops' kernels share (no knowledge of models or tiers; the ops and their kernels are in
:mod:`accelpatch.lossless.ops`, one module per op).

``library`` says what a kernel is (:class:`~.library.Kernel`, of a :class:`~.library.KernelLibrary`); ``cpu`` and
``triton_kernels`` are the two libraries (their shared checks, plans and launches; the C++ loops in
``cpu_kernels.cpp``, the ``@triton.jit`` kernels in ``triton_jit``); ``reference`` holds the one-tensor chains several
reference chains share; ``layout`` gives eager's output strides and ``tables`` exact bf16 lookup tables of unary
ops. Which kernel runs, and whether it was verified, is decided in :mod:`accelpatch.lossless.verify`.
"""
