"""The package's public names: all there, loaded on first use (the CLI re-executes itself before
any heavy import), and `mlx_spec.generate` stays the function though a submodule shares its name."""

import subprocess
import sys

import mlx_spec


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_package_or_the_cli_loads_no_mlx():
    heavy = ("mlx", "mlx_lm", "transformers")
    assert _fresh(f"import sys, mlx_spec, mlx_spec.cli; print([m for m in {heavy} if m in sys.modules])") == "[]"


def test_every_public_name_resolves():
    for name in mlx_spec.__all__:
        assert getattr(mlx_spec, name) is not None
    assert set(mlx_spec.__all__) <= set(dir(mlx_spec))
    out = _fresh("from mlx_spec import *; print(callable(load), callable(generate), SamplingParams.__name__)")
    assert out == "True True SamplingParams"


def test_generate_is_the_function_whatever_was_imported_first():
    code = ("import mlx_spec, mlx_spec.generate as g; from mlx_spec.generate import stream_generate; "
            "import sys; print(callable(mlx_spec.generate), mlx_spec.generate is sys.modules['mlx_spec.generate'].generate)")
    assert _fresh(code) == "True True"


def test_an_unknown_name_is_an_attribute_error():
    try:
        mlx_spec.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_every_command_declares_its_options_without_mlx_lm():
    # `mlx-spec CMD --help` imports the command's module and its add_arguments only: seconds of mlx-lm and
    # transformers there made every --help (and every typo'd flag) wait for them.
    code = ("import argparse, importlib, sys; from mlx_spec.cli import COMMANDS\n"
            "for module, _ in COMMANDS.values(): importlib.import_module(module).add_arguments(argparse.ArgumentParser())\n"
            "print([m for m in ('mlx_lm', 'transformers') if m in sys.modules])")
    assert _fresh(code) == "[]"
