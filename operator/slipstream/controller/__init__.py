"""Thin kopf glue, grouped by concern: the step (`loop`, `tuning`, `stages`, `objects`,
`status`, `settings`), the kopf handlers (`handlers`), the clients (`clients`: Kubernetes,
kopf's session, the engines' admin keys), the drift watch (`watch`) and the process
(`runtime`: the entry point `main.run`, malloc)."""
