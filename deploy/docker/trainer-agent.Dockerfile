# whetstone-trainer-agent, CPU variant (tiny models, CI, CPU nodes).
#   docker build -f deploy/docker/trainer-agent.Dockerfile -t ghcr.io/whetstone/whetstone-trainer-agent:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY constraints.txt ./
COPY contracts/ contracts/
COPY services/runtime/ services/runtime/
COPY services/modelkit/ services/modelkit/
COPY services/graders/ services/graders/
COPY services/trainer-agent/ services/trainer-agent/
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt ./contracts ./services/runtime ./services/modelkit ./services/graders ./services/trainer-agent

FROM python:3.11-slim
# bubblewrap: the sandbox of python graders (reinforcement fine-tuning's reward)
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/whetstone --shell /usr/sbin/nologin whetstone \
 && mkdir -p /scratch && chown 10001:10001 /scratch
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0 HF_HOME=/tmp/hf \
    WHETSTONE_TRAINER_AGENT_SCRATCH_DIR=/scratch
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.trainer_agent"]
