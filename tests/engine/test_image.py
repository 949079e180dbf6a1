"""The image: the Dockerfile applies our 0.5.18 patch file (the image is built on sglang
0.5.18 today, whichever environment runs this), and the patch of the environment's version
applies cleanly to its pristine sglang source (docker cannot run here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, VERSION

PATCH = REPO / f"engine_image/patches/sglang-{VERSION}-long-prefill.patch"
IMAGE_PATCH = REPO / "engine_image/patches/sglang-0.5.18-long-prefill.patch"
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
    assert re.search(r"^FROM lmsysorg/sglang:v0\.5\.18\s*$", text, re.M)
    copied = re.search(r"^COPY (\S+) (\S+)$", text, re.M)
    assert copied, "the Dockerfile must COPY the patch"
    # Build context is engine_image/: the COPY source is the same file the tests apply.
    assert (REPO / "engine_image" / copied.group(1)).resolve() == IMAGE_PATCH.resolve()
    assert re.search(
        rf"patch -p1 --forward --batch -d \"\$root\" < {re.escape(copied.group(2))}", text
    )
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
