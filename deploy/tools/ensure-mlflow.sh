#!/bin/sh
# Installs an MLflow tracking server into its own virtualenv, .venv-mlflow (MLflow 3 does not resolve
# against constraints.txt, so it never enters the platform's .venv: the platform talks to it over its REST
# API only). Idempotent. Used by `make test` (tests/integration/test_openai_models.py starts `mlflow server`
# from it); when the install fails it says so and exits 0, and that test skips naming the reason.
MLFLOW_VERSION=3.17.2
VENV=${MLFLOW_VENV:-.venv-mlflow}
PYTHON=${PYTHON:-python3}
if [ -x "$VENV/bin/mlflow" ] && "$VENV/bin/python" -c "import importlib.metadata as m, sys; \
sys.exit(m.version('mlflow') != '$MLFLOW_VERSION')" 2>/dev/null; then
    exit 0
fi
rm -rf "$VENV"
if ! { "$PYTHON" -m venv "$VENV" && "$VENV/bin/pip" install -q "mlflow==$MLFLOW_VERSION"; } >/dev/null 2>&1; then
    rm -rf "$VENV"
    echo "ensure-mlflow: pip install mlflow==$MLFLOW_VERSION into $VENV failed; the MLflow tracking test will skip"
fi
exit 0
