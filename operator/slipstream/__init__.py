"""Slipstream: autotunes SGLang's prefill concurrency on Kubernetes.

Stages (data flows one way): observe -> tune (consults sim) -> rollout -> engine/controller.
The package must never import torch or sglang: those live only in engine_image/.
"""

__version__ = "0.1.0"
