"""The probes that decide what the installed Triton interpreter can run (tests/_triton_interpreter.py) must be able
to say no: each is checked against an interpreter made to behave as the limited one does."""
import os

import pytest

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("probes the Triton interpreter: set TRITON_INTERPRET=1", allow_module_level=True)

import _triton_interpreter as ti  # noqa: E402


def test_scalar_loop_bounds_run_after_the_set_up():
    ti.fix_scalar_loop_bounds()
    assert ti.scalar_loop_bounds()


def test_the_loop_bound_probe_says_no_where_int_of_a_1_element_array_is_refused(monkeypatch):
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def strict_index(tensor, scope):  # as triton 3.6 with NumPy >= 2.4: int() of a 1-element 1-d array refused
        patch_tensor(tensor, scope)

        def index(self):
            if self.handle.data.ndim:
                raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
            return int(self.handle.data)

        scope.set_attr(tensor, "__index__", index)

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", strict_index)
    assert ti._loop_bound_probe() is False


def test_the_fma_probe_says_no_for_a_rounded_product_plus_a_rounded_sum(monkeypatch):
    from triton.runtime import interpreter

    ti.fma_is_fused.cache_clear()
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fma",
                        lambda self, x, y, z: interpreter.TensorHandle(
                            (x.data * y.data).astype(z.data.dtype) + z.data, z.dtype.scalar), raising=True)
    try:
        assert ti.fma_is_fused() is False  # NumPy's float32 product is rounded before the sum
    finally:
        ti.fma_is_fused.cache_clear()
