"""The create-job body as OpenAI's client sends it: method objects, the platform's extension,
deprecated top-level hyperparameters, 'auto' and learning_rate_multiplier, and bad input naming the field."""

import pytest

from whetstone.runtime.errors import ApiError
from whetstone.scheduler.entrypoints.requests import CreateJob, to_request
from whetstone.scheduler.usecases.rft import environment

pytestmark = pytest.mark.unit


def req(**body):
    return to_request(CreateJob(model="m", training_file="file-1", **body), "ftjob-x", "k", environment())


def refused(**body) -> ApiError:
    with pytest.raises(ApiError) as exc:
        req(**body)
    assert exc.value.status == 400
    return exc.value


def test_openai_method_objects_and_the_platform_extension():
    sft = req(method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": "auto"}}})
    assert sft.method == "lora" and sft.hyperparameters.n_epochs == 2 and sft.hyperparameters.batch_size == "auto"
    dpo = req(method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "learning_rate_multiplier": 2}}})
    assert dpo.method == "dpo" and dpo.hyperparameters.beta == 0.2 and dpo.hyperparameters.learning_rate == 1e-5
    assert req(method={"type": "supervised", "whetstone": {"method": "qlora"}}).method == "qlora"
    assert req(method={"type": "orpo", "orpo": {"hyperparameters": {"n_epochs": "auto"}}}).method == "orpo"
    assert req(method="full").method == "full" and req().method == "lora"
    old = req(hyperparameters={"n_epochs": 4}, seed=7)
    assert old.hyperparameters.n_epochs == 4 and old.hyperparameters.seed == 7


def test_bad_method_and_hyperparameters_name_the_field():
    assert refused(method={"type": "dpo", "whetstone": {"method": "qlora"}}).param == "method.whetstone.method"
    err = refused(method={"type": "supervised", "supervised": {"hyperparameters": {"learning_rate": 5}}})
    assert err.param == "method.supervised.hyperparameters.learning_rate"
    assert refused(hyperparameters={"n_epochs": 0}).param == "hyperparameters.n_epochs"
    assert refused(hyperparameters={"n_epochs": 2},
                   method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}}}).param \
        == "hyperparameters"
    # integrations: OpenAI's shape checked field by field; W&B runs offline (a result file), MLflow only where
    # the operator set a tracking server
    assert refused(integrations=[{"type": "comet", "comet": {}}]).param == "integrations[0].type"
    assert refused(integrations=[{"type": "mlflow", "mlflow": {}}]).param == "integrations[0].mlflow.experiment_name"
    mlflow = {"type": "mlflow", "mlflow": {"experiment_name": "sweeps/a"}}
    no_server = refused(integrations=[mlflow])
    assert (no_server.param, no_server.code) == ("integrations[0].mlflow", "integration_not_configured")
    tracked = to_request(CreateJob(model="m", training_file="file-1", integrations=[mlflow]), "ftjob-x", "k",
                         environment(), mlflow_configured=True)
    assert [(i.type, i.mlflow and i.mlflow.experiment_name) for i in tracked.integrations] == [("mlflow", "sweeps/a")]
    assert refused(integrations=[{"type": "wandb"}]).param == "integrations[0].wandb"
    missing = refused(integrations=[{"type": "wandb", "wandb": {"name": "x"}}])
    assert (missing.param, missing.code) == ("integrations[0].wandb.project", "missing_required_parameter")
    assert "integrations[0].wandb.project" in missing.message
    unknown = refused(integrations=[{"type": "wandb", "wandb": {"project": "p", "api_key": "k", "zz": 1}}])
    assert (unknown.param, unknown.code) == ("integrations[0].wandb.api_key", "invalid_value")
    assert refused(integrations=[{"type": "wandb", "wandb": {"project": "p", "tags": [""]}}]).param \
        == "integrations[0].wandb.tags.0"
    assert refused(integrations=[{"type": "wandb", "wandb": {"project": "p"}, "x": 1}]).param == "integrations[0].x"
    wandb = {"type": "wandb", "wandb": {"project": "p", "name": "run", "entity": "team", "tags": ["a"]}}
    assert refused(integrations=[wandb, wandb]).param == "integrations[1].type"
    # a well-formed W&B block is accepted (offline; no W&B key is asked for)
    [offline] = req(integrations=[wandb]).integrations
    assert offline.wandb is not None and (offline.type, offline.wandb.project, offline.wandb.entity,
                                          offline.wandb.name, offline.wandb.tags) == ("wandb", "p", "team", "run", ["a"])
    assert [i.type for i in req(integrations=[{"type": "wandb", "wandb": {"project": "p", "entity": None}}])
            .integrations] == ["wandb"]   # OpenAI's client may send null for an unset optional field
    # reinforcement needs its object (the whole method is checked in tests/integration/test_rft_jobs.py)
    assert refused(method={"type": "reinforcement"}).param == "method.reinforcement"
