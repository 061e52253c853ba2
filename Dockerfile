# voxstream: the ttsws/1 server and its engine (README "Container").
#
# GPU image (default): NVIDIA's CUDA runtime base and torch's CUDA build.
#   docker build -t voxstream .
#   docker run --gpus all -p 8000:8000 -v /srv/models/VoxCPM2:/models/VoxCPM2:ro -v voxstream-data:/data \
#     -e TTSWS_MODEL=/models/VoxCPM2 -e TTSWS_API_KEY=change-me voxstream
# CPU image, for the demo (with no model it serves the tiny random checkpoint: noise, not speech):
#   docker build -t voxstream:cpu --build-arg BASE_IMAGE=ubuntu:24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#
# The model comes from a mounted directory or a Hugging Face repo id (TTSWS_MODEL=openbmb/VoxCPM2, downloaded into
# /data/huggingface). Every server flag is an environment variable (TTSWS_*, `python -m wsserver --help`).

ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# More packages for the GPU image, e.g. a flash-attn wheel built for this torch (the engine uses PyTorch's SDPA
# attention without it).
ARG EXTRA_PIP_PACKAGES=""
ENV DEBIAN_FRONTEND=noninteractive
# Unpinned apt packages (DL3008): the base image's release fixes their versions, and its archive drops old ones.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY engine/ engine/
COPY wsserver/ wsserver/
COPY web_demo/ web_demo/
# Editable: the server finds web_demo/ and its demo checkpoint's cache next to the packages, in /app. The project's
# own requirements are pyproject.toml's (DL3013).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir -e ".[hub]" \
    && if [ -n "${EXTRA_PIP_PACKAGES}" ]; then pip install --no-cache-dir ${EXTRA_PIP_PACKAGES}; fi
# The tiny random demo checkpoint, made at build time so that the image starts offline without a model.
RUN python -c "from engine.models.voxcpm.make_checkpoint import demo_checkpoint; demo_checkpoint()"

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 libopus0 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home voxstream \
    && mkdir -p /data /models \
    && chown voxstream:voxstream /data
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/data \
    HF_HOME=/data/huggingface \
    TTSWS_HOST=0.0.0.0 \
    TTSWS_PORT=8000 \
    TTSWS_VOICES_STORE=/data/voices
WORKDIR /app
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000
# Healthy = ready: the model is loaded and warmed up (CUDA graphs take minutes on a large model) and not draining.
HEALTHCHECK --interval=10s --timeout=3s --start-period=900s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('TTSWS_PORT', '8000')}/ready\", timeout=2)"]
# SIGTERM drains (TTSWS_DRAIN_TIMEOUT_S, 30 s by default): stop with a longer grace, e.g. `docker stop -t 40`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "wsserver"]
