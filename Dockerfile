# The operator image: the slipstream package and its runtime dependencies, nothing else
# (no torch, no sglang: those live in engine_image/). The chart runs it as UID 65532 with a
# read-only root filesystem and /tmp on an emptyDir.
#   docker build -t ghcr.io/slipstream-dev/slipstream-operator:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["python", "-m", "slipstream.controller"]
