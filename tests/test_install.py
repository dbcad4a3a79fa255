"""A newcomer's first commands: a clean copy of the repository, a non-editable install into a fresh venv,
then the README's quick start and `import mlx_spec`, all typed from the clone's root."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_spec.platform_blas import OPENBLAS_CANDIDATES

ROOT = Path(__file__).resolve().parents[1]


def quick_start_install_and_run() -> str:
    """The first command block of the README's quick start, verbatim."""
    section = ROOT.joinpath("README.md").read_text().split("## Quick start", 1)[1]
    return re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory):
    """A copy of the working tree as a clone would have it (tracked and untracked-but-not-ignored files)."""
    tmp = tmp_path_factory.mktemp("newcomer")
    clone = tmp / "mlx-spec"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (clone / f).parent.mkdir(parents=True, exist_ok=True)
            (clone / f).write_bytes((ROOT / f).read_bytes())
    venv = tmp / "v"
    # System site-packages provide mlx and friends (no downloads in tests); mlx-spec itself is installed anew.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(tmp), "HF_HUB_OFFLINE": "1",
           "PIP_NO_BUILD_ISOLATION": "0", "PIP_NO_DEPS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return clone, venv, env


def run(cmd: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# the bundled-BLAS variant is the in-process path every other test takes; its newcomer run is a slow extra
@pytest.mark.parametrize("blas", ["openblas", pytest.param("bundled", marks=pytest.mark.slow)])
def test_readme_quick_start_from_the_clone_root(newcomer, blas):
    clone, venv, env = newcomer
    if blas == "bundled":
        env = dict(env, MLX_SPEC_BLAS="bundled")
    else:  # .ci/run installs OpenBLAS, so the CLI takes its re-exec path
        assert any(os.path.exists(p) for p in OPENBLAS_CANDIDATES), "install libopenblas0-pthread"
    out = run(quick_start_install_and_run(), clone, env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "generation: " in out.stderr and out.stdout.strip()
    where = run("mlx-spec doctor --help >/dev/null && python -c 'import mlx_spec.app.server, mlx_spec.app.chat, "
                "mlx_spec.metal_kernels, mlx_spec.models as m; print(m.DEFAULT_TARGET.is_dir())'", clone, env)
    assert where.returncode == 0 and where.stdout.strip() == "True", where.stderr


def test_installed_package_runs_anywhere(newcomer):
    """Away from the clone, the installed copy (weights included) is what runs."""
    clone, venv, env = newcomer
    assert run("pip install -q .", clone, env).returncode == 0
    out = run("python -c 'import mlx_spec, mlx_spec.models as m; print(mlx_spec.__file__, m.DEFAULT_TARGET)' && "
              "mlx-spec generate --prompt Hello -m 4", clone.parent, env)
    assert out.returncode == 0, out.stderr
    assert all(str(venv) in w for w in out.stdout.split()[:2]), out.stdout
