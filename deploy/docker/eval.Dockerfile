# whetstone-eval: contracts, runtime, modelkit, graders and the eval service, with torch from TORCH_INDEX.
#   CPU:  docker build -f deploy/docker/eval.Dockerfile -t ghcr.io/whetstone/whetstone-eval:0.1.0 .
#   CUDA: docker build -f deploy/docker/eval.Dockerfile --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#           -t ghcr.io/whetstone/whetstone-eval:0.1.0-cuda .
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
COPY services/graders/ services/graders/
COPY services/eval/ services/eval/
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt ./contracts ./services/runtime ./services/modelkit ./services/graders ./services/eval

FROM python:3.11-slim
# bubblewrap: the sandbox of python graders (a reinforcement job's held-out prompts are graded by the
# job's grader); without a working one python graders record an error and score 0
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/whetstone --shell /usr/sbin/nologin whetstone
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WHETSTONE_HTTP_HOST=0.0.0.0 HF_HOME=/tmp/hf
USER 10001:10001
ENTRYPOINT ["python", "-m", "whetstone.eval"]
