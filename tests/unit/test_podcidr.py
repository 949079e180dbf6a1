"""Each cluster leases a loopback pod CIDR of its own, released when it stops."""

from __future__ import annotations

import subprocess
import sys

from slipstream.localkube import podcidr


def test_two_leases_get_distinct_loopback_ranges_and_release_frees_one(tmp_path):
    first = podcidr.lease(tmp_path)
    second = podcidr.lease(tmp_path)
    try:
        assert first.cidr != second.cidr
        assert first.cidr.startswith("127.") and first.cidr.endswith(".0.0/16")
        assert first.contains(f"127.{first.octet}.0.9") and not first.contains(f"127.{second.octet}.0.9")
        first.release()
        again = podcidr.lease(tmp_path)
        assert again.octet == first.octet
        again.release()
    finally:
        first.release()
        second.release()


def test_a_lease_held_by_another_process_is_skipped_and_freed_when_it_exits(tmp_path):
    code = (
        "import sys; from pathlib import Path; from slipstream.localkube import podcidr;"
        f"l = podcidr.lease(Path({str(tmp_path)!r})); print(l.octet, flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        mine = podcidr.lease(tmp_path)
        assert mine.octet != held
        mine.release()
    finally:
        holder.kill()
        holder.wait()
    after = podcidr.lease(tmp_path)
    assert after.octet == held
    after.release()
