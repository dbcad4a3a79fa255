"""A non-editable `pip install .` gives a working `mlx-spec` with the embedded model inside the package."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_runs_offline(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    build = tmp_path / "src"  # a copy, so no build artefacts land in the checkout
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(build)], check=True)
    subprocess.run(["cp", "-r", str(ROOT / "models"), str(build)], check=True)  # include uncommitted weights
    subprocess.run(pip + [str(build)], check=True, timeout=600)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import mlx_spec, mlx_spec.models as m; "
                            "print(mlx_spec.__file__); print(m.DEFAULT_TARGET)"],
                           capture_output=True, text=True, cwd=tmp_path, check=True).stdout.split()
    assert all(str(venv) in w for w in where), where
    out = subprocess.run([str(venv / "bin" / "mlx-spec"), "generate", "--prompt", "Hello", "-m", "4"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300, env={"HF_HUB_OFFLINE": "1",
                                                                                         "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "generation: " in out.stderr
