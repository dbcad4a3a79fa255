"""msim: run MLX `mx.fast.metal_kernel` kernels on a Linux CPU.

Vendored from the workplace prototype (shared/tools/msim) and owned by mlx-spec:
changes here are ours. Local changes: the build cache lives in a per-user temp
folder (never the repo), builds are written atomically (parallel test runs),
g++ runs under `nice`, and `CUDA` source generation lives in `msim.cuda`.

    from msim import metal_kernel          # same arguments as mx.fast.metal_kernel
    k = metal_kernel(name=..., input_names=..., output_names=..., source=..., header=...)
    outs = k(inputs=..., template=..., grid=..., threadgroup=...,
             output_shapes=..., output_dtypes=..., init_value=None,
             schedule="random", seed=0)      # extra, optional

How it works
 1. The *exact* Metal source MLX would compile is obtained from MLX itself:
    metal_kernel() refuses to run without Metal, but while mx.export_function
    traces a function it still builds the kernel and, with verbose=True,
    prints the generated source (signature, [[buffer(i)]] slots, template
    instantiation).  MLX's own prelude (metal::utils()) is replaced by
    metal_shim.h.
 2. Small textual rewrites: `threadgroup T x[N];` declarations become shared
    statics; `1.0h` literals become half(1.0f).
 3. A launcher is generated from the signature, compiled with g++ into a .so
    (cached) and run through ctypes; every GPU thread is a fiber.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import mlx.core as mx

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("MSIM_CACHE") or os.path.join(
    tempfile.gettempdir(), f"mlx-spec-msim-{os.getuid()}")
ASAN = os.environ.get("MSIM_ASAN", "0") == "1"
CXX = os.environ.get("CXX", "g++")
CXXFLAGS = [
    "-std=c++20", "-O1", "-fPIC", "-shared", "-w",
    "-fsingle-precision-constant",  # MSL: unsuffixed 1.5 is a float, not a double
    "-ffp-contract=off",            # no silent FMA contraction on the host
    "-I", os.path.join(HERE, "include"), "-I", HERE,
]
if ASAN:
    CXXFLAGS += ["-fsanitize=address", "-fno-omit-frame-pointer", "-O0"]

# the real MLX factory, kept even if a test monkeypatches mx.fast.metal_kernel
_MLX_METAL_KERNEL = mx.fast.metal_kernel

_NP = {
    mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16,
    mx.int8: np.int8, mx.int16: np.int16, mx.int32: np.int32, mx.int64: np.int64,
    mx.uint8: np.uint8, mx.uint16: np.uint16, mx.uint32: np.uint32,
    mx.uint64: np.uint64, mx.bool_: np.bool_,
}


class Options(ctypes.Structure):  # must match msim::Options
    _fields_ = [("schedule", ctypes.c_int), ("seed", ctypes.c_uint32),
                ("stack_kb", ctypes.c_int), ("cuda_launch", ctypes.c_int),
                ("strict_barrier", ctypes.c_int)]


class KernelError(RuntimeError):
    pass


def _capture_fd1(fn):
    sys.stdout.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            fn()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode()


_TG_DECL = re.compile(
    r"\bthreadgroup\s+((?:const\s+)?[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)\s+"
    r"([A-Za-z_]\w*)\s*((?:\[[^\]]+\]\s*)*);")
_HALF_LIT = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[hH]\b")
_PARAM = re.compile(r"^\s*(.*?)\s*\b(\w+)\s*\[\[(\w+)(?:\((\d+)\))?\]\]\s*[,)]")


def rewrite(src: str) -> str:
    src = _TG_DECL.sub(
        lambda m: f"MSIM_TG_SHARED {m[1]} {m[2]}{m[3]}; ::msim::tg_touch(&{m[2]}, sizeof({m[2]}));",
        src)

    def half_lit(m):
        t = m[1]
        if not re.search(r"[.eE]", t):
            t += ".0"
        return f"half({t}f)"

    return _HALF_LIT.sub(half_lit, src)


def parse_signature(src: str, kernel_name: str):
    head = src[src.index(f"void {kernel_name}("):]
    head = head[: head.index(") {") + 1]
    params = []
    for line in head.splitlines()[1:]:
        m = _PARAM.match(line)
        if m:
            params.append((m[1], m[2], m[3], None if m[4] is None else int(m[4])))
    inst = re.search(r"decltype\((" + re.escape(kernel_name) + r"<.*?>)\)", src)
    callee = inst[1] if inst else kernel_name
    return params, callee


def make_launcher(params, callee):
    args = []
    for typ, name, attr, idx in params:
        if attr == "buffer":
            if typ.rstrip().endswith("&"):
                args.append(f"*(std::remove_reference_t<{typ}>*)msim_bufs[{idx}]")
            else:
                args.append(f"({typ})msim_bufs[{idx}]")
        else:
            args.append(f"::msim::attr::{attr}()")
    return (
        "\n// ---- msim launcher ----\n"
        "static void* msim_bufs[256];\n"
        f"static void msim_entry() {{\n  {callee}(\n    " + ",\n    ".join(args) + ");\n}\n"
        'extern "C" int msim_launch(void** b, int n, const unsigned* grid, const unsigned* tg,\n'
        "    const msim::Options* opt, char* err, int errlen, long* warn) {\n"
        "  for (int i = 0; i < n; i++) msim_bufs[i] = b[i];\n"
        "  return msim::launch(msim_entry, grid, tg, opt, err, errlen, warn);\n}\n"
        'extern "C" void* msim_malloc(size_t n) { return std::malloc(n ? n : 1); }\n'
        'extern "C" void msim_free(void* p) { std::free(p); }\n')


_LIBS = {}


def compile_source(cpp: str):
    key = hashlib.sha256((cpp + " ".join(CXXFLAGS) + open(os.path.join(HERE, "metal_shim.h")).read()).encode()).hexdigest()[:20]
    if key in _LIBS:
        return _LIBS[key]
    os.makedirs(CACHE, exist_ok=True)
    so = os.path.join(CACHE, f"k_{key}.so")
    if not os.path.exists(so):
        # unique temporary names: two processes may build the same kernel at once
        tag = f"{os.getpid()}_{id(cpp)}"
        src = os.path.join(CACHE, f"k_{key}_{tag}.cpp")
        with open(src, "w") as f:
            f.write(cpp)
        r = subprocess.run(["nice", "-n", "10", CXX, *CXXFLAGS, src, "-o", f"{so}.{tag}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise KernelError(f"g++ failed for {src}:\n{r.stderr[-6000:]}")
        os.replace(src, os.path.join(CACHE, f"k_{key}.cpp"))  # kept for reading reports
        os.replace(f"{so}.{tag}", so)
    lib = ctypes.CDLL(so)
    lib.msim_launch.restype = ctypes.c_int
    lib.msim_malloc.restype = ctypes.c_void_p
    lib.msim_malloc.argtypes = [ctypes.c_size_t]
    lib.msim_free.argtypes = [ctypes.c_void_p]
    _LIBS[key] = lib
    return lib


def _to_numpy(a: mx.array) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        a = mx.view(a, mx.uint16)
    return np.ascontiguousarray(np.array(a))


def _from_numpy(x: np.ndarray, dtype) -> mx.array:
    a = mx.array(x)
    return mx.view(a, mx.bfloat16) if dtype == mx.bfloat16 else a


class MetalKernel:
    def __init__(self, name, input_names, output_names, source, header="",
                 ensure_row_contiguous=True, atomic_outputs=False):
        self.name, self.input_names, self.output_names = name, list(input_names), list(output_names)
        self.source, self.header = source, header
        self.ensure_row_contiguous, self.atomic_outputs = ensure_row_contiguous, atomic_outputs
        self._mlx = _MLX_METAL_KERNEL(
            name=name, input_names=self.input_names, output_names=self.output_names,
            source=source, header=header, ensure_row_contiguous=ensure_row_contiguous,
            atomic_outputs=atomic_outputs)
        self.last_source = None
        self.last_warnings = (0, 0)

    def generated_source(self, inputs, output_shapes, output_dtypes, grid, threadgroup,
                         template=None, init_value=None):
        """The Metal source MLX generates for this call (via export tracing)."""
        def f(*xs):
            return self._mlx(inputs=list(xs), output_shapes=output_shapes,
                             output_dtypes=output_dtypes, grid=grid, threadgroup=threadgroup,
                             template=template, init_value=init_value, verbose=True)
        with tempfile.TemporaryDirectory() as d:
            out = _capture_fd1(lambda: mx.export_function(os.path.join(d, "k.mlxfn"), f, *inputs))
        m = re.search(r"Generated source code for `[^`]*`:\n```\n(.*?)\n```", out, re.S)
        if not m:
            raise KernelError("could not capture MLX's generated source:\n" + out[-2000:])
        return m[1]

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
                 template=None, init_value=None, verbose=False, stream=None,
                 schedule="forward", seed=0, launch="metal", stack_kb=64,
                 strict_barrier=False, poison=True):
        import time
        t0 = time.perf_counter()
        inputs = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
        output_shapes = [tuple(s) for s in output_shapes]
        msl = self.generated_source(inputs, output_shapes, output_dtypes, grid, threadgroup,
                                    template, init_value)
        self.last_source = msl
        if verbose:
            print(msl)
        kname = re.search(r"\[\[kernel\]\] void (\w+)\(", msl)[1]
        params, callee = parse_signature(msl, kname)
        cpp = '#include "metal_shim.h"\n' + rewrite(msl) + make_launcher(params, callee)
        t1 = time.perf_counter()
        lib = compile_source(cpp)
        t2 = time.perf_counter()

        # buffers, by name
        named = {}
        for n, a in zip(self.input_names, inputs):
            x = _to_numpy(a)
            named[n] = x
            named[n + "_shape"] = np.array(a.shape, np.int32)
            strides = np.cumprod((a.shape[1:] + (1,))[::-1])[::-1] if a.ndim else []
            named[n + "_strides"] = np.array(strides, np.int64)
            named[n + "_ndim"] = np.array([a.ndim], np.int32)
        outs = []
        for n, shp, dt in zip(self.output_names, output_shapes, output_dtypes):
            o = np.empty(shp, _NP[dt])
            if init_value is not None:
                o[...] = _to_numpy(mx.array(init_value, dtype=dt)) if dt != mx.bfloat16 else \
                    _to_numpy(mx.array(init_value).astype(mx.bfloat16))
            elif poison:
                o.view(np.uint8)[...] = 0xFF
            else:
                o[...] = 0
            named[n] = o
            outs.append(o)
        nb = max(idx for _, _, attr, idx in params if attr == "buffer") + 1
        ptrs = (ctypes.c_void_p * nb)()
        allocs = []
        for typ, name, attr, idx in params:
            if attr != "buffer":
                continue
            arr = named[name]
            p = lib.msim_malloc(arr.nbytes)  # exact-size malloc: ASan redzones
            ctypes.memmove(p, arr.ctypes.data, arr.nbytes)
            ptrs[idx] = p
            allocs.append((p, arr))
        g = (ctypes.c_uint * 3)(*grid)
        t = (ctypes.c_uint * 3)(*threadgroup)
        opt = Options({"forward": 0, "reverse": 1, "random": 2}[schedule], seed, stack_kb,
                      int(launch == "cuda"), int(strict_barrier))
        err = ctypes.create_string_buffer(1024)
        warn = (ctypes.c_long * 2)()
        t3 = time.perf_counter()
        rc = lib.msim_launch(ptrs, nb, g, t, ctypes.byref(opt), err, 1024, warn)
        self.last_times = {"mlx_trace": t1 - t0, "compile_or_load": t2 - t1, "launch": time.perf_counter() - t3}
        self.last_warnings = (warn[0], warn[1])
        try:
            if rc != 0:
                raise KernelError(f"[{self.name}] {err.value.decode()}")
            for p, arr in allocs:
                if any(arr is o for o in outs):
                    ctypes.memmove(arr.ctypes.data, p, arr.nbytes)
        finally:
            for p, _ in allocs:
                lib.msim_free(p)
        return [_from_numpy(o, dt) for o, dt in zip(outs, output_dtypes)]


def metal_kernel(name, input_names, output_names, source, header="",
                 ensure_row_contiguous=True, atomic_outputs=False, **_ignored):
    return MetalKernel(name, input_names, output_names, source, header,
                       ensure_row_contiguous, atomic_outputs)
