"""clusterkit as a user installs it: the wheel built from this checkout, installed (not editable)
into a clean venv with only its runtime dependencies (from the configured pip index), run from a
directory outside the repository. The wheel is built and installed once per session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from test_startup_imports import NEVER, NOT_FOR_HELP

REPO = Path(__file__).resolve().parent.parent
NOT_ON_A_LOGIN_NODE = ("paramiko", "cryptography", "torch", "transformers", "deepspeed", "datasets")


def _env() -> dict[str, str]:
    """This environment without PYTHONPATH & co., which would put the checkout before the install."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    )


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the sources, so the build's own files (build/, *.egg-info) stay out of
    the checkout; offline, with the setuptools already installed."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src)
    # clusterkit/recipes is the editable install's symlink to recipes/; the wheel maps recipes/ itself.
    shutil.copytree(REPO / "clusterkit", src / "clusterkit", ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    shutil.copytree(REPO / "recipes", src / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src))
    (built,) = dist.glob("clusterkit-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv without pip (this interpreter's pip installs into it) and without the system's packages."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    _pip("--python", str(root / "bin" / "python"), "install", "-q", str(wheel))
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory far from the checkout, with characters a shell or a format string trips on."""
    work = tmp_path / "my runs ~%-x"
    work.mkdir()
    return work


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "clusterkit"), *args], capture_output=True, text=True, cwd=cwd, env=_env()
    )


def test_the_wheel_ships_every_module_template_recipe_and_profile(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"clusterkit/{p.relative_to(REPO / 'clusterkit')}"
        for p in (REPO / "clusterkit").rglob("*.py")
        if "recipes" not in p.relative_to(REPO / "clusterkit").parts and "__pycache__" not in p.parts
    }
    expected |= {f"clusterkit/render/templates/{p.name}" for p in (REPO / "clusterkit/render/templates").glob("*.j2")}
    expected |= {
        f"clusterkit/recipes/{p.relative_to(REPO / 'recipes')}"
        for pattern in ("*.yaml", "clusters/*.yaml")
        for p in (REPO / "recipes").glob(pattern)
    }
    assert "clusterkit/recipes/tiny-gpt2-cpu.yaml" in expected and "clusterkit/recipes/clusters/dev.yaml" in expected
    assert not expected - names, sorted(expected - names)


def test_paramiko_and_the_training_stack_are_extras(wheel: Path) -> None:
    metadata = zipfile.ZipFile(wheel).read("clusterkit-0.1.0.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    plain = [r for r in requires if "extra ==" not in r]
    assert not [r for r in plain if r.startswith(NOT_ON_A_LOGIN_NODE)], plain
    assert any(r.startswith("paramiko") and 'extra == "ssh"' in r for r in requires)
    assert any(r.startswith("datasets") and 'extra == "datasets"' in r for r in requires)
    # Every runtime dependency stops before a major version it was not tested with.
    assert all("<" in r for r in plain), plain


def test_a_plain_install_has_no_ssh_or_training_stack(venv: Path) -> None:
    code = (
        "import importlib.util, clusterkit; print(clusterkit.__file__); "
        f"print([m for m in {NOT_ON_A_LOGIN_NODE!r} if importlib.util.find_spec(m)])"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=_env(), cwd=venv, check=True
    )
    where, found = done.stdout.splitlines()
    assert Path(where).is_relative_to(venv) and found == "[]", done.stdout


def test_the_installed_help_imports_only_the_parser(venv: Path, outside: Path) -> None:
    """As test_startup_imports, where no .pth file of a development install loads anything first."""
    code = (
        "import sys\nbare = set(sys.modules)\nfrom clusterkit.cli.main import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\nprint(' '.join(set(sys.modules) - bare), file=sys.stderr)"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=outside, env=_env()
    )
    loaded = set(done.stderr.split())
    assert "argparse" in loaded and not (NEVER | NOT_FOR_HELP) & loaded, sorted((NEVER | NOT_FOR_HELP) & loaded)
    assert done.stdout.startswith("usage: clusterkit")


def test_the_installed_cli_validates_renders_and_plans_a_shipped_recipe_by_name(venv: Path, outside: Path) -> None:
    validated = _run(venv, outside, "validate", "tiny-gpt2-cpu")
    assert (validated.returncode, validated.stdout) == (0, "tiny-gpt2-cpu: ok\n"), validated.stderr
    rendered = _run(venv, outside, "render", "tiny-gpt2-cpu", "-o", "out")
    assert rendered.returncode == 0, rendered.stderr
    script = (outside / "out" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "torch.distributed.run" in (outside / "out" / "plan.json").read_text()
    # The supervisor the job runs is the installed package's own, copied whole (its site folder too).
    copied = outside / "out" / "supervisor"
    assert all((copied / name).is_file() for name in ("__main__.py", "batch.py", "site/sitecustomize.py"))
    planned = _run(venv, outside, "plan", "llama-7b-zero3-ib", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["ranked"]
    assert _run(venv, outside, "plan", "llama-7b-zero3-ib").returncode == 0  # the table, printed with rich
    package = {p.name for p in next(venv.glob("lib/python*/site-packages/clusterkit/recipes")).iterdir()}
    applied = _run(venv, outside, "plan", "llama-7b-zero3-ib", "--apply")
    assert applied.returncode == 0 and (outside / "llama-7b-zero3-ib.planned.yaml").is_file(), applied.stderr
    assert _run(venv, outside, "validate", "llama-7b-zero3-ib.planned.yaml").returncode == 0
    assert {p.name for p in next(venv.glob("lib/python*/site-packages/clusterkit/recipes")).iterdir()} == package


def test_a_users_own_recipe_names_a_shipped_profile(venv: Path, outside: Path) -> None:
    (outside / "mine.yaml").write_text((REPO / "recipes" / "tiny-gpt2-cpu.yaml").read_text())
    assert _run(venv, outside, "validate", "mine.yaml").returncode == 0
    (outside / "typo.yaml").write_text((outside / "mine.yaml").read_text().replace("cluster: dev", "cluster: dve"))
    typo = _run(venv, outside, "validate", "typo.yaml")
    assert typo.returncode == 2 and "did you mean 'dev'?" in typo.stderr


def test_a_name_that_is_neither_a_file_nor_shipped_lists_the_shipped_recipes(venv: Path, outside: Path) -> None:
    unknown = _run(venv, outside, "validate", "tiny-gpt2")
    assert unknown.returncode == 2 and "tiny-gpt2-cpu" in unknown.stderr and unknown.stderr.count("\n") == 1
    # A path (a folder or a suffix) is never looked up among the shipped recipes.
    for written in ("./tiny-gpt2-cpu", "tiny-gpt2-cpu.yaml"):
        assert "no shipped recipe" not in _run(venv, outside, "validate", written).stderr
    # A file of that name here wins over the shipped recipe.
    (outside / "tiny-gpt2-cpu").write_text("name: [broken\n")
    assert _run(venv, outside, "validate", "tiny-gpt2-cpu").returncode == 2


@pytest.mark.train
def test_the_train_extra_keeps_the_sites_torch(wheel: Path, tmp_path: Path) -> None:
    """The install advice (docs/getting-started.md), checked with pip itself: a venv that sees the
    site's torch (here the one installed in this interpreter) installs clusterkit[train] without
    replacing it."""
    torch = pytest.importorskip("torch")
    root = tmp_path / "train-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root)], check=True)
    constraint = tmp_path / "site-torch.txt"
    constraint.write_text(f"torch=={torch.__version__}\n")
    done = _pip(
        "--python",
        str(root / "bin" / "python"),
        "install",
        "-q",
        "--dry-run",
        "--report",
        "-",
        "-c",
        str(constraint),
        f"clusterkit[train] @ {wheel.as_uri()}",
    )
    installing = {item["metadata"]["name"].lower() for item in json.loads(done.stdout)["install"]}
    assert "clusterkit" in installing and "torch" not in installing, installing
    # A site torch older than [train] allows: pip refuses instead of fetching another.
    constraint.write_text("torch==2.0.0\n")
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(root / "bin" / "python"),
            "install",
            "-q",
            "--dry-run",
            "-c",
            str(constraint),
            f"clusterkit[train] @ {wheel.as_uri()}",
        ],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert refused.returncode != 0 and "ResolutionImpossible" in refused.stderr, refused.stderr[-500:]
