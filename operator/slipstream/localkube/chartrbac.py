"""docs/operator.md's permission tables, written from the chart's rendered RBAC.

The doc's list of what the operator's ServiceAccount may do drifted from the chart once
(it left out CRD list/watch, servingdeployments/finalizers and Pod/ServiceMonitor); a table
rendered from `helm template` output cannot. `scripts/permission-table.py` rewrites the
doc's tables; tests/cluster/test_chart_render.py checks they match the chart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BEGIN = "<!-- permissions:{mode}:begin (scripts/permission-table.py writes this table) -->"
END = "<!-- permissions:{mode}:end -->"

INSTALLS: Mapping[str, tuple[str, ...]] = {
    # The values each table is rendered with: a cluster-wide install with one namespace
    # in rbac.secretNamespaces and one name in rbac.secretNames (so their rules show), and a
    # namespaced one.
    "cluster-wide": ("rbac.secretNamespaces={app}", "rbac.secretNames={engine-admin}"),
    "namespaced": ("watchNamespaces={team-a,team-b}",),
}
RELEASE, RELEASE_NAMESPACE = "r", "ops"
"""helm template's release and namespace for the tables (names read `r-slipstream...`)."""


def _where(role: str, kind: str, bindings: Sequence[Mapping[str, Any]]) -> str:
    """Where a role's rules apply: cluster-wide, or the namespaces of its RoleBindings."""
    found = [b for b in bindings if b["roleRef"]["name"] == role and b["roleRef"]["kind"] == kind]
    if any(b["kind"] == "ClusterRoleBinding" for b in found):
        return "cluster-wide"
    namespaces = sorted(b["metadata"]["namespace"] for b in found)
    return ", ".join(f"`{ns}`" for ns in namespaces) if namespaces else "(unbound)"


def _cell(values: Iterable[str]) -> str:
    return ", ".join(f"`{v}`" if v else '`""` (core)' for v in values)


def table(rendered: Iterable[Mapping[str, Any]]) -> str:
    """A Markdown table of every RBAC rule in ``rendered`` (helm template's documents),
    one row per rule, in the chart's order: role, where it applies, API groups, resources,
    names (resourceNames) and verbs."""
    docs = [d for d in rendered if d]
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    rows = ["| role | where | API groups | resources | names | verbs |", "|---|---|---|---|---|---|"]
    for role in (d for d in docs if d["kind"] in ("ClusterRole", "Role")):
        name = role["metadata"]["name"]
        if role["kind"] == "Role":
            where = f"`{role['metadata']['namespace']}`"
        else:
            where = _where(name, "ClusterRole", bindings)
        for rule in role.get("rules", []):
            rows.append(
                f"| `{name}` | {where} | {_cell(rule['apiGroups'])} | {_cell(rule['resources'])} | "
                f"{_cell(rule.get('resourceNames', [])) or 'any'} | {', '.join(rule['verbs'])} |"
            )
    return "\n".join(rows)


def replace_section(text: str, mode: str, content: str) -> str:
    """``text`` with the table of ``mode`` between its markers replaced by ``content``.

    Raises ValueError naming the markers when the doc lacks them (nothing is written)."""
    begin, end = BEGIN.format(mode=mode), END.format(mode=mode)
    pattern = re.compile(re.escape(begin) + r"\n(?:.*?\n)?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"the doc has no {begin} ... {end} section: add the two markers where the table goes")
    return pattern.sub(lambda _: f"{begin}\n{content}\n{end}", text, count=1)


def section(text: str, mode: str) -> str:
    """The table of ``mode`` as the doc has it now ("" without markers)."""
    begin, end = BEGIN.format(mode=mode), END.format(mode=mode)
    match = re.search(re.escape(begin) + r"\n(?:(.*?)\n)?" + re.escape(end), text, re.S)
    return (match.group(1) or "") if match else ""
