# whetstone-gateway: only the contracts, the runtime library and the gateway service (no torch).
#   docker build -f deploy/docker/gateway.Dockerfile -t ghcr.io/whetstone/whetstone-gateway:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY constraints.txt ./
COPY contracts/ contracts/
COPY services/runtime/ services/runtime/
COPY services/gateway/ services/gateway/
RUN pip install -c constraints.txt ./contracts ./services/runtime ./services/gateway

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin whetstone
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.gateway"]
