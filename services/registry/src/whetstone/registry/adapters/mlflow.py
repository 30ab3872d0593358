"""MlflowServer: the operator's MLflow tracking server, through MLflow's REST API (httpx, no mlflow package):
experiments/get-by-name and create, runs/search and create, runs/log-batch, runs/update, and the artifact
upload of a server that proxies artifacts (`mlflow-artifacts`)."""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from ..domain.tracking import JOB_TAG, TrackingItem

API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
PROXIED = "mlflow-artifacts:/"


class _Experiment(BaseModel):
    experiment_id: str


class _ExperimentAnswer(BaseModel):          # experiments/get-by-name
    experiment: _Experiment


class _RunInfo(BaseModel):
    run_id: str
    artifact_uri: str = ""


class _Run(BaseModel):
    info: _RunInfo


class _RunAnswer(BaseModel):                 # runs/create, runs/get
    run: _Run


class _RunsAnswer(BaseModel):                # runs/search (no `runs` key when nothing matches)
    runs: list[_Run] = []


class _Empty(BaseModel):                     # runs/log-batch, runs/update
    pass


Answer = TypeVar("Answer", bound=BaseModel)


class TrackingUnavailable(Exception):
    """The server could not be reached or answered 5xx: try again later."""


class TrackingRefused(Exception):
    """The server refused a request (4xx): sending it again would not help."""


class MlflowServer:
    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s)

    async def close(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            answer = await self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TrackingUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if answer.status_code >= 500:
            raise TrackingUnavailable(f"{method} {path}: HTTP {answer.status_code}: {answer.text[:300]}")
        return answer

    async def _json(self, shape: type[Answer], method: str, path: str, **kwargs: Any) -> Answer:
        """The answer read into `shape` (MLflow's documented fields; others ignored)."""
        answer = await self._call(method, path, **kwargs)
        if answer.status_code >= 400:
            raise TrackingRefused(f"{method} {path}: HTTP {answer.status_code}: {answer.text[:300]}")
        return _read(shape, method, path, answer)

    async def experiment_id(self, name: str) -> str:
        """The experiment's id, created on first use (a concurrent create answers RESOURCE_ALREADY_EXISTS)."""
        found = await self._call("GET", f"{API}/experiments/get-by-name", params={"experiment_name": name})
        if found.status_code == 200:
            return _read(_ExperimentAnswer, "GET", "experiments/get-by-name", found).experiment.experiment_id
        try:
            return (await self._json(_Experiment, "POST", f"{API}/experiments/create", json={"name": name})).experiment_id
        except TrackingRefused:
            again = await self._json(_ExperimentAnswer, "GET", f"{API}/experiments/get-by-name",
                                     params={"experiment_name": name})
            return again.experiment.experiment_id

    async def run_of_job(self, experiment_id: str, job_id: str) -> str | None:
        """A run made for the job before (its id not yet stored when the tracker stopped): found by its tag."""
        found = await self._json(_RunsAnswer, "POST", f"{API}/runs/search", json={
            "experiment_ids": [experiment_id], "filter": f"tags.\"{JOB_TAG}\" = '{job_id}'", "max_results": 1})
        return found.runs[0].info.run_id if found.runs else None

    async def create_run(self, experiment_id: str, run_name: str, job_id: str, start_ms: int) -> str:
        made = await self._json(_RunAnswer, "POST", f"{API}/runs/create", json={
            "experiment_id": experiment_id, "run_name": run_name, "start_time": start_ms,
            "tags": [{"key": JOB_TAG, "value": job_id}]})
        return made.run.info.run_id

    async def log_batch(self, run_id: str, batch: TrackingItem) -> None:
        await self._json(_Empty, "POST", f"{API}/runs/log-batch", json={
            "run_id": run_id, "params": [p.model_dump() for p in batch.params],
            "tags": [t.model_dump() for t in batch.tags], "metrics": [m.model_dump() for m in batch.metrics]})

    async def upload(self, run_id: str, path: str, data: bytes, content_type: str) -> None:
        """A file into the run's artifacts; only through a server that proxies artifacts."""
        root = (await self._json(_RunAnswer, "GET", f"{API}/runs/get", params={"run_id": run_id})).run.info.artifact_uri
        if not root.startswith(PROXIED):
            raise TrackingRefused(f"the run's artifact root {root!r} is not served by the tracking server "
                                  "(start it with --serve-artifacts); artifact not uploaded")
        answer = await self._call("PUT", f"{ARTIFACTS}/{root[len(PROXIED):].strip('/')}/{path}", content=data,
                                  headers={"Content-Type": content_type})
        if answer.status_code >= 400:
            raise TrackingRefused(f"PUT artifact {path}: HTTP {answer.status_code}: {answer.text[:300]}")

    async def end_run(self, run_id: str, status: str, end_ms: int) -> None:
        await self._json(_Empty, "POST", f"{API}/runs/update", json={"run_id": run_id, "status": status, "end_time": end_ms})


def _read(shape: type[Answer], method: str, path: str, answer: httpx.Response) -> Answer:
    try:
        return shape.model_validate_json(answer.content or b"{}")
    except ValidationError as exc:
        raise TrackingRefused(f"{method} {path}: an answer without MLflow's fields ({exc.errors()[0]['msg']}): "
                              f"{answer.text[:300]}") from exc
