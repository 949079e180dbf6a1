"""The image: the Dockerfile builds the release its SGLANG_VERSION build arg names (the
newest by default) on that release's official image with that release's patch file, and
the patch of the environment's version applies cleanly to its pristine sglang source
(docker cannot run here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, VERSION

PATCH = REPO / f"engine_image/patches/sglang-{VERSION}-long-prefill.patch"
DOCKERFILE = REPO / "engine_image/Dockerfile"


def pristine_sglang_dir() -> Path:
    out = subprocess.run(
        [sys.executable, "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return Path(out.stdout.strip().splitlines()[-1])


def test_dockerfile_uses_the_official_image_and_our_patch():
    text = DOCKERFILE.read_text()
    default = re.search(r"^ARG SGLANG_VERSION=(\S+)$", text, re.M)
    assert default and default.group(1) == "0.5.23", "the default build is the newest release"
    assert re.search(r"^FROM lmsysorg/sglang:v\$\{SGLANG_VERSION\}\s*$", text, re.M)
    copied = re.search(r"^COPY (\S+) (\S+)$", text, re.M)
    assert copied, "the Dockerfile must COPY the patches"
    # Build context is engine_image/: the COPY source holds the same file the tests apply,
    # and the RUN step patches with the file of the release the build arg names.
    assert PATCH.resolve() in {p.resolve() for p in (REPO / "engine_image").glob(copied.group(1))}
    named = re.search(r'patch_file="(\S+)"', text)
    assert named, "the RUN step names the patch file by the build arg"
    image_patch = named.group(1).replace("${SGLANG_VERSION}", VERSION)
    assert image_patch == copied.group(2).rstrip("/") + "/" + PATCH.name
    assert 'patch -p1 --forward --batch -d "$root" < "$patch_file"' in text
    assert "set -eux" in text  # a failing patch fails the build


def test_patch_applies_cleanly_to_pristine_sglang(tmp_path):
    src = pristine_sglang_dir()
    assert re.search(
        rf"__version__ = version = ['\"]{re.escape(VERSION)}['\"]",
        (src / "_version.py").read_text(),
    ), f"not sglang {VERSION}"
    assert not (src / "srt/managers/long_prefill.py").exists(), "not the pristine source"
    root = tmp_path / "root"
    shutil.copytree(src, root / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    dry = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "--dry-run", "-d", str(root)],
        stdin=PATCH.open(),
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "offset" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout
    real = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "-d", str(root)],
        stdin=PATCH.open(),
        capture_output=True,
        text=True,
    )
    assert real.returncode == 0, real.stdout + real.stderr
    assert not list(root.rglob("*.rej"))
    # Applying twice is refused: the patch is not already in the pristine source.
    again = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "--dry-run", "-d", str(root)],
        stdin=PATCH.open(),
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0
