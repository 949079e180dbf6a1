"""docs/operator.md's permission tables from rendered RBAC (slipstream.localkube.chartrbac)."""

from __future__ import annotations

import pytest

from slipstream.localkube import chartrbac

ROLE = {"kind": "ClusterRole", "metadata": {"name": "r-x"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                  {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "resourceNames": ["r-x"], "verbs": ["patch"]}]}  # fmt: skip


def binding(kind: str, ns: str | None = None) -> dict:
    meta = {"name": "r-x", **({"namespace": ns} if ns else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": "ClusterRole", "name": "r-x"}}


def test_rows_say_where_each_rule_applies() -> None:
    rows = chartrbac.table([ROLE, binding("RoleBinding", "b"), binding("RoleBinding", "a")]).splitlines()
    assert rows[2] == '| `r-x` | `a`, `b` | `""` (core) | `pods` | any | list |'
    assert rows[3] == "| `r-x` | `a`, `b` | `kopf.dev` | `kopfpeerings` | `r-x` | patch |"
    assert "| cluster-wide |" in chartrbac.table([ROLE, binding("ClusterRoleBinding")])


def test_a_section_is_replaced_between_its_markers_and_a_doc_without_them_is_refused() -> None:
    begin, end = chartrbac.BEGIN.format(mode="m"), chartrbac.END.format(mode="m")
    doc = f"before\n{begin}\n{end}\nafter\n"
    once = chartrbac.replace_section(doc, "m", "| t |")
    assert once == f"before\n{begin}\n| t |\n{end}\nafter\n"
    assert chartrbac.section(once, "m") == "| t |"
    assert chartrbac.replace_section(once, "m", "| u |") == f"before\n{begin}\n| u |\n{end}\nafter\n"
    with pytest.raises(ValueError, match="permissions:other:begin"):
        chartrbac.replace_section(doc, "other", "| t |")
