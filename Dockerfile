# One image for every gpushare component: gpushare-extender, gpushare-device-plugin, kubectl-inspect-gpushare
# and gpushare. The Helm chart picks the entry point per workload.
#
#   docker build -t gpushare:0.1.0 \
#     --build-arg PYTHON_DIGEST=sha256:<index digest of python:3.11-slim-trixie> \
#     --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
#
# PYTHON_DIGEST pins the base image by content; docs/install.md says how to look it up. Without it the build takes
# whatever the tag points to on the day, so release builds pass it. Debian trixie, not bookworm: its OpenSSL 3.5
# does the extender's mutual-TLS handshake in about 0.6 of OpenSSL 3.0's CPU (docs/extender.md). The lock's wheels
# also install on bookworm (scripts/check_lock.py), so PYTHON_IMAGE=python:3.11-slim-bookworm still builds.
ARG PYTHON_IMAGE=python:3.11-slim-trixie
ARG PYTHON_DIGEST=

# Build: every file pip installs is checked against a sha256 from the lock (requirements-*.txt, generated from
# constraints.txt by scripts/lock.sh), and only wheels are accepted, since building an sdist would run unhashed code.
FROM ${PYTHON_IMAGE}${PYTHON_DIGEST:+@}${PYTHON_DIGEST} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# A C compiler for mypyc, which compiles the placement policies (pyproject.toml lists them); the slim base has the
# Python headers. Only the builder has it: the final stage copies the compiled venv.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY requirements-build.txt requirements-image.txt ./
# The build tools get their own venv (/opt/build): the pinned pip, hatchling, grpcio-tools and mypy, which build the
# wheel. The runtime venv (/opt/gpushare) has no pip at all: /opt/build's pip installs into it with --python.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps --only-binary=:all: -r requirements-build.txt \
 && python -m venv --without-pip /opt/gpushare \
 && /opt/build/bin/pip --python /opt/gpushare/bin/python install --require-hashes --no-deps --only-binary=:all: \
      -r requirements-image.txt
COPY pyproject.toml README.md ./
COPY scripts/hatch_build.py scripts/gen_protos.py scripts/
COPY protos/ protos/
COPY gpushare/ gpushare/
COPY extender/ extender/
COPY deviceplugin/ deviceplugin/
COPY inspect_cli/ inspect_cli/
# --no-build-isolation: the wheel is built by /opt/build's hash-checked hatchling and grpcio-tools, not by copies
# pip would fetch unchecked; the project itself is the only file installed without a hash (it is built right here).
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation -w /tmp/dist . \
 && /opt/build/bin/pip --python /opt/gpushare/bin/python install --no-deps /tmp/dist/gpushare-*.whl \
 && /opt/gpushare/bin/gpushare --help >/dev/null

# Run: the same base and the runtime venv alone (no pip, setuptools, wheel or build tools), an unprivileged user
# by default (the device plugin's pod asks for root). The base image's own pip, setuptools and wheel go too: nothing
# at run time installs packages.
FROM ${PYTHON_IMAGE}${PYTHON_DIGEST:+@}${PYTHON_DIGEST}
ARG PYTHON_IMAGE
ARG PYTHON_DIGEST
ARG VERSION=0.1.0
ARG REVISION=
ARG CREATED=
ARG SOURCE=https://github.com/gpushare/gpushare
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="GPU sharing for Kubernetes: scheduler extender, device plugin and kubectl plugin" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}" \
      org.opencontainers.image.base.digest="${PYTHON_DIGEST}"
RUN python -m pip uninstall -q -y pip setuptools wheel \
 && groupadd --gid 65532 gpushare \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpushare
COPY --from=builder /opt/gpushare /opt/gpushare
ENV PATH=/opt/gpushare/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
CMD ["gpushare", "--help"]
