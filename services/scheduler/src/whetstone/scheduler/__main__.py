import asyncio
import gc
from typing import Any

from whetstone.runtime.service import run_services

from .bootstrap import build_service


def freeze_startup_objects(_runtimes: Any = None) -> None:
    """Once the service is up, move everything alive (modules, app, pools, consumers: they live as long
    as the process) out of the cyclic collector's sight, so a full collection walks only what requests
    and events made since instead of stopping the event loop for the whole heap."""
    gc.collect()
    gc.freeze()


def main() -> None:
    asyncio.run(run_services([build_service()], ready=freeze_startup_objects))


if __name__ == "__main__":
    main()
