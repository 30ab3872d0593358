# whetstone-scheduler: only the contracts, the runtime library and the scheduler service (no torch).
#   docker build -f deploy/docker/scheduler.Dockerfile -t ghcr.io/whetstone/whetstone-scheduler:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY constraints.txt ./
COPY contracts/ contracts/
COPY services/runtime/ services/runtime/
COPY services/graders/ services/graders/
COPY services/scheduler/ services/scheduler/
RUN pip install -c constraints.txt ./contracts ./services/runtime ./services/graders ./services/scheduler

FROM python:3.11-slim
# bubblewrap: the sandbox of tenants' python graders (/v1/fine_tuning/alpha/graders/run); without a
# working one (the pod's seccomp profile must allow user namespaces) python graders are refused
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin whetstone
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.scheduler"]
