#!/usr/bin/env bash
# Edit a patch as code, not as diff text: unpack it into a tree, change the tree, write the
# patch back from the tree.
#
#   engine_image/patches/tree.sh unpack VERSION DIR   DIR/a/sglang = pristine sglang VERSION,
#                                                      DIR/b/sglang = the same with the patch
#   engine_image/patches/tree.sh pack VERSION DIR     writes patches/sglang-VERSION-long-prefill.patch
#                                                      from diff -ruN DIR/a DIR/b
#
# The pristine package comes from the engine-test environment of VERSION
# (engine_image/test-env/setup.sh, which creates it when missing). The written patch has no
# timestamps and its files in sorted order, so two edits of different functions merge as
# text and the patch applies with no offset or fuzz (tests/engine/test_image.py checks it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cmd="${1:?usage: tree.sh unpack|pack VERSION DIR}"
version="${2:?usage: tree.sh unpack|pack VERSION DIR}"
dir="${3:?usage: tree.sh unpack|pack VERSION DIR}"
patch_file="$here/sglang-$version-long-prefill.patch"

case "$cmd" in
unpack)
    env_dir="$(SGLANG_VERSION="$version" bash "$repo/engine_image/test-env/setup.sh")"
    src="$("$env_dir/bin/python" -c 'import os, sglang; print(os.path.dirname(sglang.__file__))' 2>/dev/null \
        || ls -d "$env_dir"/lib/python3*/site-packages/sglang)"
    rm -rf "$dir/a" "$dir/b"
    mkdir -p "$dir/a" "$dir/b"
    cp -r "$src" "$dir/a/sglang"
    find "$dir/a" -name __pycache__ -type d -prune -exec rm -rf {} +
    cp -r "$dir/a/sglang" "$dir/b/sglang"
    (cd "$dir/b" && patch -p1 -s --no-backup-if-mismatch < "$patch_file")
    echo "==> [patch-tree] $dir/a (pristine $version), $dir/b (patched): edit $dir/b, then: $0 pack $version $dir" >&2
    ;;
pack)
    [[ -d "$dir/a/sglang" && -d "$dir/b/sglang" ]] || { echo "ERROR: $dir has no a/sglang and b/sglang (run unpack first)" >&2; exit 2; }
    tmp="$(mktemp)"
    # diff exits 1 when the trees differ, which is the point.
    (cd "$dir" && LC_ALL=C diff -ruN -x __pycache__ -x '*.pyc' a/sglang b/sglang || [[ $? == 1 ]]) \
        | sed -E -e 's#^(---|\+\+\+) ([^\t]+)\t.*$#\1 \2#' -e 's#^diff -ruN .* (a/sglang/[^ ]+ b/sglang/[^ ]+)$#diff -ruN \1#' > "$tmp"
    mv "$tmp" "$patch_file"
    echo "==> [patch-tree] wrote $patch_file ($(grep -c '^diff ' "$patch_file") files)" >&2
    ;;
*)
    echo "usage: tree.sh unpack|pack VERSION DIR" >&2
    exit 2
    ;;
esac
