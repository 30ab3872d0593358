# whetstone-ingest: contracts, runtime, modelkit and the ingest service, with torch from TORCH_INDEX.
#   CPU:  docker build -f deploy/docker/ingest.Dockerfile -t ghcr.io/whetstone/whetstone-ingest:0.1.0 .
#   CUDA: docker build -f deploy/docker/ingest.Dockerfile --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#           -t ghcr.io/whetstone/whetstone-ingest:0.1.0-cuda .
FROM python:3.11-slim AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, from the chosen index, so no dependency pulls another build
RUN pip install --index-url $TORCH_INDEX torch==2.13.0
COPY constraints.txt ./
COPY contracts/ contracts/
COPY services/runtime/ services/runtime/
COPY services/modelkit/ services/modelkit/
COPY services/ingest/ services/ingest/
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt ./contracts ./services/runtime ./services/modelkit ./services/ingest

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/whetstone --shell /usr/sbin/nologin whetstone
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0 HF_HOME=/tmp/hf
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.ingest"]
