# One image for every gpushare component: gpushare-extender, gpushare-device-plugin, kubectl-inspect-gpushare
# and gpushare. The Helm chart picks the entry point per workload.
#
#   docker build -t gpushare:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build: install the project the way the README does (pip install .) into a venv that the final stage copies, with
# the exact versions of constraints.txt, for the package build too (--build-constraint needs the pinned pip first).
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY scripts/hatch_build.py scripts/gen_protos.py scripts/
COPY protos/ protos/
COPY gpushare/ gpushare/
COPY extender/ extender/
COPY deviceplugin/ deviceplugin/
COPY inspect_cli/ inspect_cli/
RUN python -m venv /opt/gpushare \
 && /opt/gpushare/bin/pip install --upgrade -c constraints.txt pip \
 && /opt/gpushare/bin/pip install -c constraints.txt --build-constraint constraints.txt . \
 && /opt/gpushare/bin/gpushare --help >/dev/null

# Run: the same base, the venv, and an unprivileged user by default (the device plugin's pod asks for root).
FROM ${PYTHON_IMAGE}
RUN groupadd --gid 65532 gpushare \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpushare
COPY --from=builder /opt/gpushare /opt/gpushare
ENV PATH=/opt/gpushare/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
CMD ["gpushare", "--help"]
