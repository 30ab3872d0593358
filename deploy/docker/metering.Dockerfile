# whetstone-metering: only the contracts, the runtime library and the metering service (no torch).
#   docker build -f deploy/docker/metering.Dockerfile -t ghcr.io/whetstone/whetstone-metering:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY constraints.txt ./
COPY contracts/ contracts/
COPY services/runtime/ services/runtime/
COPY services/metering/ services/metering/
RUN pip install -c constraints.txt ./contracts ./services/runtime ./services/metering

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin whetstone
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.metering"]
