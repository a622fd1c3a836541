"""A small CUDA matmul with nothing but the driver (ctypes on libcuda and a PTX kernel JIT-compiled
by the driver), so the GPU test needs no torch or cupy: ``python gpu_matmul.py SECONDS``.

It multiplies two 1024 x 1024 float32 matrices on the first visible device, again and again for
SECONDS, checks a few entries of the product against numpy, and prints ``ok``.
"""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np

PTX = r"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry matmul(
    .param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)
{
    .reg .pred p, q;
    .reg .b32 r<12>;
    .reg .b64 rd<12>;
    .reg .f32 f<4>;

    ld.param.u64 rd1, [pa];
    ld.param.u64 rd2, [pb];
    ld.param.u64 rd3, [pc];
    ld.param.u32 r1, [pn];
    cvta.to.global.u64 rd1, rd1;
    cvta.to.global.u64 rd2, rd2;
    cvta.to.global.u64 rd3, rd3;
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.u32 r5, r2, r3, r4;
    mov.u32 r2, %ctaid.y;
    mov.u32 r3, %ntid.y;
    mov.u32 r4, %tid.y;
    mad.lo.u32 r6, r2, r3, r4;
    setp.ge.u32 p, r5, r1;
    @p bra DONE;
    setp.ge.u32 p, r6, r1;
    @p bra DONE;
    mov.f32 f1, 0f00000000;
    mov.u32 r7, 0;
LOOP:
    mad.lo.u32 r8, r6, r1, r7;
    mul.wide.u32 rd4, r8, 4;
    add.s64 rd5, rd1, rd4;
    ld.global.f32 f2, [rd5];
    mad.lo.u32 r9, r7, r1, r5;
    mul.wide.u32 rd6, r9, 4;
    add.s64 rd7, rd2, rd6;
    ld.global.f32 f3, [rd7];
    fma.rn.f32 f1, f2, f3, f1;
    add.u32 r7, r7, 1;
    setp.lt.u32 q, r7, r1;
    @q bra LOOP;
    mad.lo.u32 r10, r6, r1, r5;
    mul.wide.u32 rd8, r10, 4;
    add.s64 rd9, rd3, rd8;
    st.global.f32 [rd9], f1;
DONE:
    ret;
}
"""


def check(cuda: ctypes.CDLL, name: str, *args: object) -> None:
    rc = getattr(cuda, name)(*args)
    if rc != 0:
        raise RuntimeError(f"{name} failed with CUDA error {rc}")


def main(seconds: float) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    n = 1024
    size = n * n * 4
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda, "cuInit", 0)
    check(cuda, "cuDeviceGet", ctypes.byref(dev), 0)
    check(cuda, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    check(cuda, "cuCtxSetCurrent", ctx)
    check(cuda, "cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(PTX.encode()))
    check(cuda, "cuModuleGetFunction", ctypes.byref(fn), mod, b"matmul")
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.zeros((n, n), dtype=np.float32)
    ptrs = [ctypes.c_uint64() for _ in range(3)]
    for p in ptrs:
        check(cuda, "cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(size))
    for p, host in zip(ptrs[:2], (a, b), strict=True):
        check(
            cuda, "cuMemcpyHtoD_v2", p, host.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(size)
        )
    nn = ctypes.c_uint32(n)
    params = (ctypes.c_void_p * 4)(
        *(ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (*ptrs, nn))
    )
    launches, deadline = 0, time.time() + seconds
    while time.time() < deadline:
        check(cuda, "cuLaunchKernel", fn, n // 16, n // 16, 1, 16, 16, 1, 0, None, params, None)
        check(cuda, "cuCtxSynchronize")
        launches += 1
    check(
        cuda, "cuMemcpyDtoH_v2", c.ctypes.data_as(ctypes.c_void_p), ptrs[2], ctypes.c_size_t(size)
    )
    want = a @ b
    for i, j in ((0, 0), (n - 1, n - 1), (17, 901)):
        assert abs(c[i, j] - want[i, j]) <= 1e-3 * abs(want[i, j]), (i, j, c[i, j], want[i, j])
    print(f"ok: {launches} matmuls of {n}x{n} in {seconds:g}s", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
