#!/usr/bin/env bash
# Creates (or reuses) the engine-test environment and the patched copy of sglang.
#
#   engine_image/test-env/setup.sh      -> prints the environment's directory on stdout
#
# The environment lives outside the repository, in
#   ${SLIPSTREAM_CACHE:-~/.cache/slipstream}/engine-env-<hash of requirements.txt + python>/
# and is reused while requirements.txt is unchanged. Inside it:
#   bin/python                 the interpreter (pristine sglang 0.5.18 in its site-packages)
#   patched-<patch hash>/      a copy of the installed sglang package with
#                              engine_image/patches/sglang-0.5.18-long-prefill.patch applied
#   patched -> patched-<hash>  the copy for the current patch
# Progress goes to stderr. A patch that does not apply fails the script (exit 1).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
req="$here/requirements.txt"
patch_file="$repo/engine_image/patches/sglang-0.5.18-long-prefill.patch"
python="${ENGINE_TEST_PYTHON:-python3}"
cache="${SLIPSTREAM_CACHE:-$HOME/.cache/slipstream}"

say() { echo "==> [engine-env] $*" >&2; }

pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
key="$( (cat "$req"; echo "python=$pyver") | sha256sum | cut -c1-16)"
env_dir="$cache/engine-env-$key"
mkdir -p "$cache"

if [[ -f "$env_dir/.complete" ]]; then
    say "reusing $env_dir"
else
    say "creating $env_dir (python $pyver); first run downloads ~3 GB (torch and its CUDA runtime wheels)"
    start=$(date +%s)
    rm -rf "$env_dir"
    "$python" -m venv "$env_dir"
    "$env_dir/bin/python" -m pip install -q --upgrade pip >&2
    # --no-deps: requirements.txt is a complete lock; sglang's GPU-only dependencies stay out.
    "$env_dir/bin/python" -m pip install --no-deps --progress-bar on -r "$req" >&2
    "$env_dir/bin/python" - <<'EOF' >&2
import importlib
for m in ("torch", "sglang.srt.managers.schedule_policy", "sglang.srt.managers.scheduler"):
    importlib.import_module(m)
import torch, sglang
print(f"torch {torch.__version__}, sglang {sglang.__version__}: scheduler modules import")
EOF
    touch "$env_dir/.complete"
    say "environment ready in $(( $(date +%s) - start )) s"
fi

site="$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
phash="$(sha256sum "$patch_file" | cut -c1-16)"
patched="$env_dir/patched-$phash"
if [[ -f "$patched/.applied" ]]; then
    say "reusing patched sglang in $patched"
else
    say "copying sglang and applying $(basename "$patch_file")"
    rm -rf "$patched" "$patched.tmp"
    mkdir -p "$patched.tmp"
    cp -r "$site/sglang" "$patched.tmp/sglang"
    find "$patched.tmp" -name __pycache__ -type d -prune -exec rm -rf {} +
    if ! patch -p1 --forward --batch --silent -d "$patched.tmp" < "$patch_file" >&2; then
        echo "ERROR: $patch_file does not apply to the installed sglang ($site/sglang)" >&2
        rm -rf "$patched.tmp"
        exit 1
    fi
    if find "$patched.tmp" -name '*.rej' | grep -q .; then
        echo "ERROR: $patch_file left rejected hunks" >&2
        exit 1
    fi
    touch "$patched.tmp/.applied"
    mv "$patched.tmp" "$patched"
    # Copies made for earlier versions of the patch are no longer used.
    for old in "$env_dir"/patched-*; do
        [[ "$old" == "$patched" || ! -d "$old" ]] || rm -rf "$old"
    done
fi
ln -sfn "$patched" "$env_dir/patched"
echo "$env_dir"
