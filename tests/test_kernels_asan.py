"""Out-of-bounds checks: every kernel on odd shapes under AddressSanitizer, and
two deliberately unclamped variants that must be reported."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).parent / "msim" / "asan_cases.py"


def _libasan():
    if not shutil.which("g++"):
        return None
    p = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return p if os.path.isabs(p) and os.path.exists(p) else None


pytestmark = pytest.mark.skipif(_libasan() is None, reason="g++ with libasan is needed")


def run(case):
    env = dict(os.environ, MSIM_ASAN="1", ASAN_OPTIONS="detect_leaks=0", LD_PRELOAD=_libasan())
    r = subprocess.run([sys.executable, str(CHILD), case], env=env, capture_output=True,
                       text=True, timeout=600)
    out = r.stdout + r.stderr
    hits = [line for line in out.splitlines() if "ERROR: AddressSanitizer" in line]
    return r.returncode, hits, out


def test_kernels_are_in_bounds():
    rc, hits, out = run("clean")
    assert rc == 0 and not hits and "finished clean" in out, out[-4000:]


@pytest.mark.parametrize("case", ["qmm_noclamp", "attn_noclamp"])
def test_out_of_bounds_is_reported(case):
    rc, hits, out = run(case)
    assert rc != 0 and hits and "heap-buffer-overflow" in hits[0], out[-4000:]
