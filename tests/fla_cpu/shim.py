"""Run flash-linear-attention's Triton kernels on a CPU through Triton's interpreter (tests only).

``TRITON_INTERPRET=1`` executes Triton kernels with numpy, but three gaps in triton 3.9.0's interpreter
stop fla's gated-delta-rule kernels from running or from computing the right numbers:

1. Autotuning benchmarks every config through the GPU driver ("0 active drivers"): keep the first config
   that survives the kernel's own pruning, so nothing is benchmarked.
2. ``for i in range(...)`` leaves ``i`` a Python int where compiled Triton has a tensor, so fla's
   ``i_t.to(tl.int64)`` fails: each such loop body starts by turning its variable into an interpreter tensor.
3. bf16 is stored as raw uint16 and arithmetic runs on the bit patterns (results ~1e9), and fp32→bf16
   truncates: here bf16 values live as float32 rounded to bf16 (nearest-even) after every operation, and
   are encoded to / decoded from 16 bits only where they meet memory.

The patches reach into interpreter internals, so they are pinned to the triton version they were written
against; :func:`activate` refuses any other. Never imported by the product: tests load it through
``bootstrap.py`` in the separate fla venv (see conftest.py).
"""

from __future__ import annotations

import ast
import os
import warnings

TRITON_VERSION = "3.9.0"
_active = False


class ShimUnavailable(RuntimeError):
    """The installed triton is not the version these patches were written for."""


def to_bits(x):
    """float32 values -> bf16 bit patterns (uint16), rounding to nearest-even; NaN stays NaN."""
    import numpy as np

    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded).astype(np.uint16)


def from_bits(bits):
    """bf16 bit patterns (uint16) -> float32 values (exact)."""
    import numpy as np

    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(x):
    return from_bits(to_bits(x))


def _patch_autotune() -> None:
    from triton.runtime import autotuner

    prune = autotuner.Autotuner.prune_configs

    def first_config(self, kwargs):
        return prune(self, kwargs)[:1]

    autotuner.Autotuner.prune_configs = first_config


def _is_range_loop(node: ast.For) -> bool:
    call = node.iter
    if not isinstance(call, ast.Call) or not isinstance(node.target, ast.Name):
        return False
    fn = call.func
    # range(...) and tl.range(...) are runtime loops in compiled Triton; static_range stays constexpr.
    return (isinstance(fn, ast.Name) and fn.id == "range") or (isinstance(fn, ast.Attribute) and fn.attr == "range")


def _patch_loop_variables() -> None:
    from triton.runtime import interpreter

    def visit_For(self, node):
        node = self.generic_visit(node)
        if _is_range_loop(node):
            name = node.target.id
            to_tensor = ast.Call(
                func=ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                   ctx=ast.Load()),
                args=[ast.Name(id=name, ctx=ast.Load()), ast.Constant(value=False)], keywords=[])
            node.body.insert(0, ast.copy_location(
                ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=to_tensor), node))
        return node

    interpreter.ASTTransformer.visit_For = visit_For
    interpreter.InterpretedFunction.rewritten_fn.clear()  # nothing rewritten before the patch is kept


def _patch_bf16() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    builder = it.InterpreterBuilder
    np_dtype, validate, post_init = it._get_np_dtype, it._validate_np_data_size, it.TensorHandle.__post_init__
    load, store = builder.create_masked_load, builder.create_masked_store
    cast, fp_to_fp, bitcast = builder.cast_impl, builder.create_fp_to_fp, builder.create_bitcast
    f32 = np.dtype(np.float32)

    def is_bf16(dtype) -> bool:
        return getattr(dtype, "scalar", dtype) == tl.bfloat16 or getattr(dtype, "element_ty", None) == tl.bfloat16

    def get_np_dtype(tt_dtype):
        return f32 if not isinstance(tt_dtype, tl.pointer_type) and is_bf16(tt_dtype) else np_dtype(tt_dtype)

    def validate_size(array, tl_dtype):
        return True if tl_dtype == tl.bfloat16 else validate(array, tl_dtype)

    def handle_post_init(self):
        if self.dtype == tl.bfloat16:
            self.data = round_bf16(self.data)  # every bf16 result is re-rounded, as bf16 hardware would
        post_init(self)

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        if ptrs.get_element_ty() != tl.bfloat16:
            return load(self, ptrs, mask, other, cache_policy, is_volatile)
        other_bits = np.zeros_like(ptrs.data, dtype=np.uint16) if other is None else to_bits(other.data)
        bits = it._interpreter.load(ptrs.data, mask.data, other_bits, np.dtype(np.uint16))
        return it.TensorHandle(from_bits(bits), tl.bfloat16)

    def masked_store(self, ptrs, value, mask, cache_policy):
        if ptrs.get_element_ty() == tl.bfloat16:
            value = it.TensorHandle(to_bits(value.data), tl.uint16)
        return store(self, ptrs, value, mask, cache_policy)

    def cast_impl(self, src, dst_type):
        if is_bf16(src.dtype) or is_bf16(dst_type):
            return it.TensorHandle(src.data.astype(get_np_dtype(dst_type.scalar)), dst_type.scalar)
        return cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if is_bf16(src.dtype) or is_bf16(dst_type):
            return cast_impl(self, src, dst_type)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    def create_bitcast(self, src, dst_type):
        data = to_bits(src.data) if is_bf16(src.dtype) else src.data
        if is_bf16(dst_type):
            return it.TensorHandle(from_bits(data.view(np.uint16)), tl.bfloat16)
        return bitcast(self, it.TensorHandle(data, tl.uint16) if is_bf16(src.dtype) else src, dst_type)

    it._get_np_dtype, it._validate_np_data_size = get_np_dtype, validate_size
    it.TensorHandle.__post_init__ = handle_post_init
    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    # The builder binds these names as class attributes (some through lambdas calling cast_impl).
    builder.cast_impl, builder.create_fp_to_fp, builder.create_bitcast = cast_impl, create_fp_to_fp, create_bitcast
    for name in ("create_si_to_fp", "create_ui_to_fp", "create_fp_to_si", "create_fp_to_ui", "create_fp_ext",
                 "create_fp_trunc"):
        setattr(builder, name, lambda self, src, dst_type: self.cast_impl(src, dst_type))
    builder.create_int_to_ptr = builder.create_ptr_to_int = create_bitcast


def triton_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def _patch_builtin_lookup() -> None:
    """Speed only: the interpreter re-lists every triton.language member on each device-function call."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    found: dict[int, list] = {}

    def patch_builtin(pkg, builder, scope):
        members = found.get(id(pkg))
        if members is None:
            members = found[id(pkg)] = [(n, m) for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name, member in members:
            if getattr(pkg, name, None) is member:  # already patched by an enclosing call: leave it
                interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin


def activate() -> None:
    """Switch Triton to its interpreter and apply the patches; call before fla or transformers is imported."""
    global _active
    if _active:
        return
    installed = triton_version()
    if installed != TRITON_VERSION:
        raise ShimUnavailable(f"tests/fla_cpu/shim.py patches triton {TRITON_VERSION}'s interpreter; "
                              f"triton {installed or '(none)'} is installed")
    # Before triton is imported: triton.language's own @jit helpers are built at import time.
    os.environ["TRITON_INTERPRET"] = "1"
    _patch_autotune()
    _patch_loop_variables()
    _patch_bf16()
    _patch_builtin_lookup()
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    _active = True
