"""Kernels with no knowledge of models (see issue #3 for sol_attn)."""
