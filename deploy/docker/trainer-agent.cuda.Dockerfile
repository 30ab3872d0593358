# whetstone-trainer-agent, CUDA variant (GPU nodes: torch CUDA build, DeepSpeed, bitsandbytes).
#   docker build -f deploy/docker/trainer-agent.cuda.Dockerfile -t ghcr.io/whetstone/whetstone-trainer-agent:0.1.0-cuda .
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0 && pip install wheel setuptools
COPY constraints.txt ./
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
 && DS_BUILD_OPS=0 pip install --no-build-isolation -c /tmp/constraints.txt deepspeed
COPY contracts/ contracts/
COPY services/runtime/ services/runtime/
COPY services/modelkit/ services/modelkit/
COPY services/graders/ services/graders/
COPY services/trainer-agent/ services/trainer-agent/
RUN pip install -c /tmp/constraints.txt ./contracts ./services/runtime ./services/modelkit ./services/graders ./services/trainer-agent

FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
# bubblewrap: the sandbox of python graders (reinforcement fine-tuning's reward)
RUN apt-get update && apt-get install -y --no-install-recommends python3.12 bubblewrap && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/whetstone --shell /usr/sbin/nologin whetstone \
 && mkdir -p /scratch && chown 10001:10001 /scratch
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0 HF_HOME=/tmp/hf \
    WHETSTONE_TRAINER_AGENT_SCRATCH_DIR=/scratch NCCL_DEBUG=WARN
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.trainer_agent"]
