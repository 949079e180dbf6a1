"""Thin kopf glue: handlers (`handlers`), the owned objects (`objects`), status (`status`),
the Kubernetes client (`kube`) and the entry point (`main.run`)."""
