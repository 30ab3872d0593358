from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class EvalSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_EVAL_", extra="ignore")
    http_port: int = 8103
    max_holdout_rows: int = 256
    max_len: int = 512
    min_improvement: float = 0.0
    max_regression_vs_last: float = 0.05
