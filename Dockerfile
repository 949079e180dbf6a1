# The operator image: the operator's runtime and its dependencies, nothing else. No torch,
# no sglang (those live in engine_image/), no `kubernetes` package, and none of the
# tooling: the local cluster, the demo, the benchmarks, the engine simulator, the plots and
# the CLI stay in the repository (the `tools` extra; tests/unit/test_runtime_only.py checks
# that the runtime imports none of them and that this file removes each; the local stacks
# run the operator as this image does, through slipstream/runtime_only.py). The chart runs
# it as UID 65532 with a read-only root filesystem and /tmp on an emptyDir.
#   docker build -t ghcr.io/slipstream-dev/slipstream-operator:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN set -eux; \
    cd operator/slipstream; \
    rm -rf localkube demo enginesim scalebench.py canarycheck.py cli.py sim/plots.py runtime_only.py; \
    cd /src; \
    python -m pip install --no-cache-dir --prefix=/install .; \
    rm -f /install/bin/slipstream; \
    PYTHONPATH="$(echo /install/lib/python3.11/site-packages)" python -c "import slipstream.controller.runtime.main"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["python", "-m", "slipstream.controller"]
