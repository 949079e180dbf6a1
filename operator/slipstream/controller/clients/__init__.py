"""Clients of the controller: the Kubernetes API (`kube`), kopf's bounded apiserver session
(`apisession`) and the engines' admin keys (`adminkeys`)."""
