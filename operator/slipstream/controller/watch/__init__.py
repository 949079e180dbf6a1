"""The drift watch: hand edits of owned objects (`drift`), which objects it has judged
(`judged`), the engine Deployments as it last saw them (`deployments`) and other writers
of their replicas (`replicas`)."""
