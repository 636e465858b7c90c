"""Bit-exact fused kernels of the models' element-wise chains (no knowledge of models or tiers).

``reference`` holds each chain as eager computes it; ``cpu`` and ``triton_kernels`` hold implementations that
reproduce it bit for bit; ``layout`` gives eager's output strides and ``tables`` exact bf16 lookup tables of unary
ops. Which implementation runs, and whether it was verified, is decided in :mod:`accelpatch.lossless.verify`.
"""
