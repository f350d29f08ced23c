"""`make install` and the Dockerfile ask for the CPU build of torch by name (`torch==X+cpu`), so
that a machine whose pip sees only PyPI (where Linux's plain `torch==X` is the CUDA build, with
about 19 nvidia packages) can never get the CUDA build silently, and both check the result.

Static checks: `make -n` prints the commands make would run, with its variables expanded, and the
Dockerfile's torch step is expanded by a real `sh` with the image's default build arguments.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def make_dry_run(tmp_path: Path) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-B", "install", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return out.splitlines()


def test_make_install_asks_for_the_cpu_build_of_torch_and_checks_it(tmp_path):
    lines = make_dry_run(tmp_path)
    torch_installs = [ln for ln in lines if "pip install" in ln and "torch" in ln]
    assert torch_installs, lines
    for ln in torch_installs:
        for cmd in ln.split("||"):  # every alternative asks for +cpu: none can fall back to CUDA
            specs = re.findall(r"torch[=<>!~][^\"' ]*", cmd)
            assert specs == ["torch==2.13.0+cpu"], cmd
            assert "--index-url" not in cmd.replace("--extra-index-url", ""), "add PyTorch's index, keep pip's own"
    assert any(f"--extra-index-url {CPU_INDEX}" in ln for ln in torch_installs)
    # after everything is installed (so a later step cannot swap torch unnoticed): a CUDA torch fails
    checks = [k for k, ln in enumerate(lines) if "torch.version.cuda is None" in ln]
    editable = [k for k, ln in enumerate(lines) if "pip install" in ln and "-e " in ln]
    assert checks and editable and checks[-1] > editable[-1], lines
    assert "sys.exit(" in lines[checks[-1]]
    assert not any(re.search(r"torch(==2\.13\.0|>=)[^+]", ln) for ln in lines), "no request that PyPI's CUDA build satisfies"


def dockerfile_args_and_runs() -> tuple[dict[str, str], list[str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    args, runs = {}, []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("ARG ") and "=" in ln:
            key, _, value = ln[4:].partition("=")
            args.setdefault(key.strip(), value.strip())
        elif ln.startswith("RUN "):
            runs.append(ln[4:])
    return args, runs


@pytest.mark.parametrize("index,want", [(None, "torch==2.13.0+cpu"),
                                        ("https://download.pytorch.org/whl/cu128/", "torch==2.13.0+cu128")])
def test_dockerfile_asks_for_the_build_its_index_names(index, want, tmp_path):
    """The default image asks for `+cpu`; `--build-arg TORCH_INDEX_URL=.../cu128` (deploy/README.md)
    asks for `+cu128`. The step's own shell words are expanded by sh, as in `docker build`."""
    if shutil.which("sh") is None:
        pytest.skip("no sh")
    args, runs = dockerfile_args_and_runs()
    assert args["TORCH_INDEX_URL"] == CPU_INDEX
    [step] = [r for r in runs if "pip install --index-url" in r and "torch==" in r]
    parts = [p.strip() for p in step.split("&&")]
    [install] = [p for p in parts if p.startswith("pip install --index-url")]
    setup = [p for p in parts[: parts.index(install)] if not p.startswith("pip ")]
    script = "; ".join([*setup, "printf '%s\\n' " + install.removeprefix("pip install ")])
    script = script.replace("/tmp/torch-constraint.txt", str(tmp_path / "constraint.txt"))
    env = {"PATH": "/usr/bin:/bin", "TORCH_VERSION": args["TORCH_VERSION"], "TORCH_INDEX_URL": index or args["TORCH_INDEX_URL"]}
    words = subprocess.run(["sh", "-ec", script], env=env, capture_output=True, text=True, check=True, cwd="/tmp").stdout.split("\n")
    assert words[:3] == ["--index-url", index or CPU_INDEX, want]
    check = next(p for p in parts[parts.index(install) + 1 :] if p.startswith("python -c"))
    assert "torch.version.cuda" in check and "sys.exit(" in check
    # `pip install .` keeps that exact build (the constraint file written with it)
    assert (tmp_path / "constraint.txt").read_text().split() == [want]
    assert [r for r in runs if re.search(r"PIP_CONSTRAINT=/tmp/torch-constraint\.txt pip install \.(\s|$)", r)]
