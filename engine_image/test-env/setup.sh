#!/usr/bin/env bash
# Creates (or reuses) the engine-test environment and the patched copy of sglang.
#
#   [SGLANG_VERSION=0.5.23] engine_image/test-env/setup.sh   -> prints the environment's directory
#
# SGLANG_VERSION (default 0.5.18) picks the lock: requirements.txt for 0.5.18,
# requirements-<version>.txt for the others (0.5.23). The environment lives outside the
# repository, in
#   ${SLIPSTREAM_CACHE:-~/.cache/slipstream}/engine-env-<hash of the lock + python>/
# (one per version, since each lock pins its sglang) and is reused while the lock is
# unchanged. Inside it:
#   bin/python                 the interpreter (pristine sglang <version> in its site-packages)
#   patched-<patch hash>/      a copy of the installed sglang package with
#                              engine_image/patches/sglang-<version>-long-prefill.patch applied
#   patched -> patched-<hash>  the copy for the patch last set up (tests/engine/run.sh
#                              reads patched-<hash of its own patch> instead, so checkouts
#                              with different patches do not test each other's)
# A version with no patch file (both 0.5.18 and 0.5.23 have one) gets a pristine-only
# environment: the patch step is skipped (said on stderr) and there is no patched/ link.
# Progress goes to stderr. A patch that does not apply fails the script (exit 1).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="${SGLANG_VERSION:-0.5.18}"
if [[ "$version" == 0.5.18 ]]; then
    req="$here/requirements.txt"
else
    req="$here/requirements-$version.txt"
fi
if [[ ! -f "$req" ]]; then
    supported="0.5.18 $(cd "$here" && ls requirements-*.txt 2>/dev/null | sed 's/^requirements-//; s/\.txt$//' | tr '\n' ' ')"
    echo "ERROR: SGLANG_VERSION=$version: no lock file $req (supported: $supported)" >&2
    exit 2
fi
if ! grep -qx "sglang==$version" "$req"; then
    echo "ERROR: $req does not pin sglang==$version (SGLANG_VERSION=$version)" >&2
    exit 2
fi
patch_file="$repo/engine_image/patches/sglang-$version-long-prefill.patch"
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
    say "creating $env_dir (sglang $version, python $pyver); first run downloads ~3 GB (torch and its CUDA runtime wheels)"
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
    installed="$("$env_dir/bin/python" -c 'import sglang; print(sglang.__version__)')"
    if [[ "$installed" != "$version" ]]; then
        echo "ERROR: $env_dir has sglang $installed, not $version" >&2
        exit 1
    fi
    touch "$env_dir/.complete"
    say "environment ready in $(( $(date +%s) - start )) s"
fi

if [[ ! -f "$patch_file" ]]; then
    say "no patch for sglang $version ($(basename "$patch_file") is missing): patch step skipped; pristine-only environment (no patched/)"
    rm -f "$env_dir/patched"
    echo "$env_dir"
    exit 0
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
fi
touch "$patched/.applied"  # last use: copies of other patches are kept while in use
# Copies of other versions of the patch (older commits, other worktrees) unused for a day.
# A run reads its own copy by hash (tests/engine/run.sh), never through the link, so two
# checkouts with different patches can test side by side.
find "$env_dir" -maxdepth 2 -path "$env_dir/patched-*/.applied" -mmin +1440 -printf '%h\n' \
    | while read -r old; do [[ "$old" == "$patched" ]] || rm -rf "$old"; done
ln -sfn "$patched" "$env_dir/patched.tmp-link-$$" && mv -T "$env_dir/patched.tmp-link-$$" "$env_dir/patched"
echo "$env_dir"
